"""Export the folded backbone (and, with --full, the model's tensor forward) to ONNX.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W [--out model.onnx] [--full]

The model is folded first, then traced for a 1 x 3 x H x W input: the file runs on that shape.
The exported graph is run with onnxruntime on the same input and compared with PyTorch; the
tool fails if they differ by more than --atol. --full works for single-stage detectors
(RetinaNet); mmdet's two-stage detectors and mmseg's segmentors need data samples or
shape-dependent pooling in their tensor forward, so export their backbone, or the whole model
with mmdeploy.

The ONNX file may not be an input (the config, the checkpoint, a file the config reads) or a
link to one; it is written atomically: a failed export leaves no file, an existing one is
replaced in one step.
"""

import argparse
import os.path as osp
import sys

import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.outputs import guarded_config
from mmrepa.integrations.onnx import (
    TensorForward,
    export_onnx,
    onnx_max_abs_error,
    onnxruntime_session,
)
from mmrepa.integrations.optional import require
from mmrepa.utils.files import atomic_output

TOOL = 'tools/export_onnx.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', action=ConfigPath)
    parser.add_argument('checkpoint', nargs='?')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'), required=True)
    parser.add_argument('--out', help='ONNX file (default: <config name>_backbone.onnx)')
    parser.add_argument(
        '--full',
        action='store_true',
        help="export the model's tensor forward instead of the backbone",
    )
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument('--atol', type=float, default=1e-4)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


@one_line_errors(TOOL)
def main(argv=None) -> float:
    """Returns the max abs difference between onnxruntime and PyTorch."""
    args = parse_args(argv)
    name = osp.splitext(osp.basename(args.config))[0]
    out = args.out or f'{name}_{"full" if args.full else "backbone"}.onnx'
    require('onnx', 'onnxruntime', tool=TOOL)
    cfg = guarded_config(TOOL, [('--out', out)], args.config, args.checkpoint, args.cfg_options)
    model = mmrepa.reparameterize(init_model(cfg, args.checkpoint))
    module = TensorForward(model) if args.full else model.backbone
    x = torch.randn(1, 3, *args.shape)
    with atomic_output(out) as tmp:
        try:
            export_onnx(module, x, tmp, args.opset)
        except Exception as e:
            if not args.full:
                raise
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ''
            sys.exit(
                f"{type(model).__name__}'s tensor forward does not export with "
                f'torch.onnx ({type(e).__name__}: {reason[:200]}). Export the backbone '
                '(drop --full), or the whole model with mmdeploy, whose rewrites handle '
                'these heads.'
            )
        err = onnx_max_abs_error(module, x, onnxruntime_session(tmp))
    print(
        f'exported the folded {"model" if args.full else "backbone"} to {out}; onnxruntime '
        f'vs PyTorch max abs difference {err:.2e}'
    )
    if not err <= args.atol:
        sys.exit(f'onnxruntime disagrees with PyTorch by {err:.2e} > {args.atol:g}')
    return err


if __name__ == '__main__':
    main()
