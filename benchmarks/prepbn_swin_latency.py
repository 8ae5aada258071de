"""Latency and fold error of a PRepBN-Swin backbone before and after folding.

    PYTHONPATH=. python benchmarks/prepbn_swin_latency.py [--arch tiny] [--size 800 1333]
        [--attn-types SSSS] [--repeat 5] [--warmup 1]

Builds the backbone with Swin's initialisation, gives its BatchNorms statistics of its own
features (``recalibrate_bn`` on random images, so the RepBN layers are not left at 0/1),
then reports the largest output difference between the unfolded and folded backbone in float64
and float32, and the median latency of both (interleaved with ``time_interleaved``, together
with the LayerNorm Swin of the same arch for reference) on one image of the given size. Weights
are random: the latency does not depend on them (denormals are flushed to zero, see below).
"""
import argparse
import copy
import statistics

import torch

from mmrepa import reparameterize
from mmrepa.backbones import PRepBNSwin, RePaSwin
from mmrepa.engine import recalibrate_bn
from mmrepa.utils import time_interleaved


def max_abs_diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--arch', default='tiny')
    parser.add_argument('--attn-types', default='SSSS')
    parser.add_argument('--size', type=int, nargs=2, default=(800, 1333), metavar=('H', 'W'))
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, help='torch threads (default: torch\'s choice)')
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # random weights saturate some softmaxes; the resulting denormal activations slow x86 GEMMs
    # down several times, which trained weights do not do
    torch.set_flush_denormal(True)

    torch.manual_seed(0)
    model = PRepBNSwin(arch=args.arch, attn_types=args.attn_types, drop_path_rate=0.)
    images = [torch.randn(1, 3, 224, 224) for _ in range(4)]
    recalibrate_bn(model, images, model, num_batches=len(images))
    model.eval()
    x = torch.randn(1, 3, *args.size)

    errors = {}
    for dtype in (torch.float64, torch.float32):
        a = copy.deepcopy(model).to(dtype)
        b = reparameterize(copy.deepcopy(a))  # folded from weights of this dtype
        ref = a(x.to(dtype))
        errors[dtype] = (max_abs_diff(b(x.to(dtype)), ref),
                         max(r.abs().max().item() for r in ref))
    for dtype, (err, scale) in errors.items():
        print(f'fold error {str(dtype):>13}: max abs {err:.3e} (largest output {scale:.3g})')

    folded = reparameterize(copy.deepcopy(model))
    swin = RePaSwin(arch=args.arch, idle_ratio=0., ffn_norm='LN').eval()
    variants = dict(unfolded=model, folded=folded, layernorm_swin=swin)
    stats = time_interleaved({name: (lambda m=m: m(x)) for name, m in variants.items()},
                             repeat=args.repeat, warmup=args.warmup)
    print(f'PRepBN-Swin-{args.arch} ({args.attn_types}) backbone, 1x3x{args.size[0]}x'
          f'{args.size[1]}, {torch.get_num_threads()} threads, median of {args.repeat}:')
    for name, st in stats.items():
        print(f'  {name:<15}{st.median:9.1f} ms   samples {[round(s) for s in st.samples]}')
    before, after = stats['unfolded'].median, stats['folded'].median
    # rounds are interleaved: the per-round ratio cancels drift of a shared machine
    ratio = statistics.median(f / u for u, f in zip(stats['unfolded'].samples,
                                                    stats['folded'].samples))
    print(f'  folding: {100 * (after - before) / before:+.1f} % (medians), '
          f'{100 * (ratio - 1):+.1f} % (median per-round ratio)')


if __name__ == '__main__':
    main()
