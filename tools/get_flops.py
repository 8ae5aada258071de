"""Parameters and GMACs of a config's model before and after folding.

    python tools/get_flops.py CONFIG [--shape H W] [--checkpoint CKPT]

Counts with mmengine's analysis (one multiply-accumulate = one MAC; attention included), on the
whole model's tensor forward and on the backbone alone.
"""
import argparse
import copy

import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model
from mmrepa.utils import complexity


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'), default=None,
                        help='input size (default: 800 1333 for detection, 512 512 for '
                        'segmentation)')
    parser.add_argument('--checkpoint')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    model = init_model(args.config, args.checkpoint, cfg_options=args.cfg_options)
    shape = tuple(args.shape or ((512, 512) if model.cfg.default_scope == 'mmseg' else
                                 (800, 1333)))
    folded = mmrepa.reparameterize(copy.deepcopy(model))
    x = torch.randn(1, 3, *shape)
    rows = {}
    with torch.no_grad():
        for scope, get in (('model', lambda m: m), ('backbone', lambda m: m.backbone)):
            rows[scope] = [complexity(get(m), (x, )) for m in (model, folded)]
    print(f'{args.config}, input 1x3x{shape[0]}x{shape[1]}')
    print(f"{'':<10}{'params M before':>16}{'after':>9}{'GMACs before':>14}{'after':>9}"
          f"{'ratio':>8}")
    for scope, (b, a) in rows.items():
        print(f"{scope:<10}{b['params'] / 1e6:>16.2f}{a['params'] / 1e6:>9.2f}"
              f"{b['macs'] / 1e9:>14.2f}{a['macs'] / 1e9:>9.2f}{b['macs'] / a['macs']:>8.3f}")
    return rows


if __name__ == '__main__':
    main()
