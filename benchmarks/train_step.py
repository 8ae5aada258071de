"""Training cost of RePa-Swin against mmdet's SwinTransformer of the same size.

    python benchmarks/train_step.py [--arch tiny] [--shape 512 512] [--batch 2] [--repeat 5]

One training step = forward of the backbone, a loss on all outputs, backward, AdamW step.
The two backbones are timed interleaved. RePa-Swin trains with its default channel-idle FFN
(idle_ratio 0.75, BatchNorm); the target is at most 1.05x the time of mmdet's Swin.
"""

import argparse

import torch

from mmrepa.backbones import RePaSwin
from mmrepa.backbones.swin import ARCH_SETTINGS
from mmrepa.utils import time_interleaved
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--arch', default='tiny', choices=sorted(ARCH_SETTINGS))
    parser.add_argument('--shape', nargs=2, type=int, default=(512, 512), metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--out', help='write the result as JSON here')
    return parser.parse_args()


def step_fn(model, x):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = sum(o.float().pow(2).mean() for o in model(x))
        loss.backward()
        opt.step()

    return step


def main():
    args = parse_args()
    from mmdet.models.backbones import SwinTransformer

    arch = ARCH_SETTINGS[args.arch]
    torch.manual_seed(0)
    swin = SwinTransformer(
        embed_dims=arch['embed_dims'],
        depths=arch['depths'],
        num_heads=arch['num_heads'],
        drop_path_rate=0.1,
    )
    repa = RePaSwin(arch=args.arch, drop_path_rate=0.1)
    swin.train()
    repa.train()
    x = torch.randn(args.batch, 3, *args.shape)
    machine = machine_info()
    stats = time_interleaved(
        {'mmdet SwinTransformer': step_fn(swin, x), 'RePaSwin': step_fn(repa, x)},
        repeat=args.repeat,
        warmup=args.warmup,
        progress=lambda d, t: print(f'round {d}/{t}', flush=True),
    )
    finish(machine)
    ratio = stats['RePaSwin'].median / stats['mmdet SwinTransformer'].median
    for name, s in stats.items():
        print(f'{name:<24} {s.median:9.1f} ms/step (min {s.min:.1f}, max {s.max:.1f})')
    print(
        f'RePaSwin / mmdet Swin training step: {ratio:.3f} (target <= 1.05), '
        f'{args.arch}, batch {args.batch}, {args.shape[0]}x{args.shape[1]}, '
        f'{torch.get_num_threads()} threads'
    )
    if args.out:
        write_json(
            dict(
                vars(args),
                ratio=ratio,
                median_ms={k: v.median for k, v in stats.items()},
                machine=machine,
            ),
            args.out,
        )


if __name__ == '__main__':
    main()
