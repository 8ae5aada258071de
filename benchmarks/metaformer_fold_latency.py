"""Latency of a (RePa-)CAFormer / ConvFormer backbone before and after folding, and the fold error.

    PYTHONPATH=. python benchmarks/metaformer_fold_latency.py --arch m36 --idle-ratio 0.75 \
        --size 800 1333 --repeat 5

Times the backbone alone on one image (eval mode, no autograd), unfolded and folded
interleaved (``mmrepa.utils.latency.time_interleaved``), and prints the median and the maximum
absolute difference of the four outputs. Weights are random (PyTorch's default initialisation)
with non-trivial BatchNorm statistics: latency does not depend on trained values.
"""
import argparse
import copy

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, ConvFormer
from mmrepa.utils.latency import time_interleaved


def build(args) -> torch.nn.Module:
    cls = CAFormer if args.model == 'caformer' else ConvFormer
    model = cls(args.arch, idle_ratio=args.idle_ratio)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--model', choices=['caformer', 'convformer'], default='caformer')
    parser.add_argument('--arch', default='m36')
    parser.add_argument('--idle-ratio', type=float, default=0.75)
    parser.add_argument('--size', type=int, nargs=2, default=(800, 1333), metavar=('H', 'W'))
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=None, help='torch threads (default: all)')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = build(args)
    folded = reparameterize(copy.deepcopy(model))
    x = torch.randn(1, 3, *args.size)
    with torch.no_grad():
        ref, out = model(x), folded(x)
    err = max((r - o).abs().max().item() for r, o in zip(ref, out))
    scale = max(r.abs().max().item() for r in ref)
    stats = time_interleaved(dict(unfolded=lambda: model(x), folded=lambda: folded(x)),
                             repeat=args.repeat, warmup=args.warmup)
    params = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (model, folded)]
    before, after = stats['unfolded'].median, stats['folded'].median
    print(f'{args.model}-{args.arch} idle_ratio={args.idle_ratio} input 1x3x{args.size[0]}x'
          f'{args.size[1]}, {torch.get_num_threads()} threads, {args.repeat} timed rounds')
    print(f'params (M)          {params[0]:9.2f} -> {params[1]:9.2f}')
    change = 100 * (after - before) / before
    print(f'median latency (ms) {before:9.1f} -> {after:9.1f}  ({change:+.1f} %)')
    print(f'min latency (ms)    {stats["unfolded"].min:9.1f} -> {stats["folded"].min:9.1f}')
    print(f'fp32 fold error: max abs {err:.2e} (outputs up to {scale:.2f})')


if __name__ == '__main__':
    main()
