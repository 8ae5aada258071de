"""Export the Hyper-Search constants of a trained HS model in the official scales layout.

    python tools/misc/repopt_export_scales.py HS_CONFIG HS_CHECKPOINT OUT.pth [--force]

OUT holds one vector per layer and branch, ``stage0.scale_{conv,1x1}.weight`` and
``stage{k}.{j}.scale_{conv,1x1,identity}.weight`` (the layout of the released
RepOpt-VGG-*-scales.pth files), which a target config takes as ``model.backbone.scales``. The
checkpoint is loaded strictly into the HS config's model first, so a checkpoint of another arch
stops here. OUT may not be an input (the checkpoint, the config) or a link to one, even with
--force; it is written atomically, and an existing OUT needs --force.
"""

import argparse
import sys

from mmrepa.apis import init_model
from mmrepa.checkpoint import save_atomically
from mmrepa.integrations.cli.args import one_line_errors
from mmrepa.integrations.cli.outputs import guarded_config

TOOL = 'tools/misc/repopt_export_scales.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', help="Hyper-Search config (RepOptVGG mode='hs')")
    parser.add_argument('checkpoint', help='checkpoint of that config')
    parser.add_argument('out', help='scales file to write')
    parser.add_argument('--force', action='store_true', help='replace an existing OUT')
    return parser.parse_args(argv)


@one_line_errors(TOOL)
def main(argv=None):
    args = parse_args(argv)
    outputs = [('OUT', args.out)]
    cfg = guarded_config(TOOL, outputs, args.config, args.checkpoint, force=args.force)
    backbone = init_model(cfg, args.checkpoint).backbone
    if type(backbone).__name__ != 'RepOptVGG' or backbone.mode != 'hs':
        sys.exit(
            f"{args.config}: the backbone is not RepOptVGG(mode='hs'); give the "
            'Hyper-Search config the checkpoint was trained with'
        )
    scales = backbone.export_scales()
    save_atomically(scales, args.out)
    print(
        f'wrote {len(scales)} scale vectors ({sum(v.numel() for v in scales.values())} '
        f'values) to {args.out}; use it as model.backbone.scales of a target config'
    )


if __name__ == '__main__':
    main()
