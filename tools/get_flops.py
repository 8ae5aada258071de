"""Parameters and GMACs of a config's model before and after folding.

    python tools/get_flops.py CONFIG [--shape H W] [--checkpoint CKPT]

Counts with mmengine's analysis (one multiply-accumulate = one MAC; attention included): the
backbone alone on a 1 x 3 x H x W tensor, and the whole model's tensor forward on an H x W image
sent through the config's test pipeline (which may resize it, as it does real images).
"""
import argparse
import copy

import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model, pipeline_batch
from mmrepa.utils import complexity, model_complexity


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
    with torch.no_grad():
        data = model.data_preprocessor(pipeline_batch(model.cfg, shape), False)
        x = torch.randn(1, 3, *shape)
        rows = dict(model=[model_complexity(m, data) for m in (model, folded)],
                    backbone=[complexity(m.backbone, (x, )) for m in (model, folded)])
    print(f"{args.config}: backbone on 1x3x{shape[0]}x{shape[1]}; model on a {shape[0]}x"
          f"{shape[1]} image through the test pipeline, input {tuple(data['inputs'].shape)}")
    print(f"{'':<10}{'params M before':>16}{'after':>9}{'GMACs before':>14}{'after':>9}"
          f"{'ratio':>8}")
    for scope, (b, a) in rows.items():
        print(f"{scope:<10}{b['params'] / 1e6:>16.2f}{a['params'] / 1e6:>9.2f}"
              f"{b['macs'] / 1e9:>14.2f}{a['macs'] / 1e9:>9.2f}{b['macs'] / a['macs']:>8.3f}")
    return rows


if __name__ == '__main__':
    main()
