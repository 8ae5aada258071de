"""Export the folded backbone (and, with --full, the model's tensor forward) to ONNX.

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W [--out model.onnx] [--full]

The model is folded first. The exported graph is run with onnxruntime on the same input and
compared with PyTorch; the export fails if they differ by more than --atol.
"""
import argparse
import os.path as osp
import sys

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model


class TensorForward(nn.Module):
    """``model(inputs, mode='tensor')`` with its nested outputs flattened to a tuple."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return tuple(_flatten(self.model(x, mode='tensor')))


def _flatten(out):
    if isinstance(out, torch.Tensor):
        yield out
    else:
        for item in out:
            yield from _flatten(item)


def export(module: nn.Module, x: torch.Tensor, path: str, opset: int = 17) -> None:
    with torch.no_grad():
        n_out = len(tuple(_flatten(module(x))))
    torch.onnx.export(module, (x, ), path, input_names=['input'],
                      output_names=[f'output{i}' for i in range(n_out)], opset_version=opset,
                      dynamo=False)


def onnxruntime_session(path: str):
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=['CPUExecutionProvider'])


def check(module: nn.Module, x: torch.Tensor, path: str) -> float:
    """Max abs difference between onnxruntime and PyTorch outputs."""
    with torch.no_grad():
        ref = [t.cpu().numpy() for t in _flatten(module(x))]
    outs = onnxruntime_session(path).run(None, {'input': x.cpu().numpy()})
    if len(outs) != len(ref):
        raise RuntimeError(f'onnxruntime returned {len(outs)} outputs, PyTorch {len(ref)}')
    return max(float(np.abs(o - r).max()) for o, r in zip(outs, ref))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'), required=True)
    parser.add_argument('--out', help='ONNX file (default: <config name>_backbone.onnx)')
    parser.add_argument('--full', action='store_true',
                        help="export the model's tensor forward instead of the backbone")
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument('--atol', type=float, default=1e-4)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    model = mmrepa.reparameterize(init_model(args.config, args.checkpoint,
                                             cfg_options=args.cfg_options))
    module = TensorForward(model) if args.full else model.backbone
    name = osp.splitext(osp.basename(args.config))[0]
    out = args.out or f"{name}_{'full' if args.full else 'backbone'}.onnx"
    x = torch.randn(1, 3, *args.shape)
    export(module, x, out, args.opset)
    err = check(module, x, out)
    print(f'exported the folded {"model" if args.full else "backbone"} to {out}; onnxruntime '
          f'vs PyTorch max abs difference {err:.2e}')
    if not err <= args.atol:
        sys.exit(f'onnxruntime disagrees with PyTorch by {err:.2e} > {args.atol:g}')


if __name__ == '__main__':
    main()
