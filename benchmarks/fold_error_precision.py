"""What each precision costs in fold error: folded against unfolded backbones under autocast.

    PYTHONPATH=. python benchmarks/fold_error_precision.py [--shape 227 301] [--out OUT.json]

Folds are always computed in float64 and written back in the weights' dtype; at inference the
folded weights then meet the precision the model runs in. For each backbone (random weights
with every 1-D parameter moved off its initial value, as benchmarks/fold_error.py) and each
precision (float32; torch.autocast bfloat16 and float16 over float32 weights; the whole model
cast to bfloat16), this reports the fold error (folded vs unfolded, both in that precision) next
to the precision's own error (the unfolded model in that precision vs float32), relative to
the largest output. A fold costs nothing beyond the precision when the first is of the order of
the second.
"""

import argparse
import contextlib
import copy
import functools
import os.path as osp
import sys

import torch
from mmengine.logging import MMLogger

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from fold_error import BACKBONES, errors, perturb_  # noqa: E402

from mmrepa import reparameterize  # noqa: E402
from mmrepa.backbones import DepthRepViT, RepOptVGG  # noqa: E402
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info  # noqa: E402

MORE = {
    'RepVGG-B1 (RepOptVGG mode repvgg)': lambda: RepOptVGG('B1', mode='repvgg'),
    'DepthRepViT-Tiny 6x2, logit join (λ = 1)': lambda: DepthRepViT(
        'tiny',
        depth=6,
        join_lambda=1.0,
        with_cls_token=False,
        out_type='featmap',
        window_size=14,
        global_blocks=(2, 5),
        out_indices=(5,),
    ),
}
PRECISIONS = {
    'float32': (torch.float32, contextlib.nullcontext),
    'autocast bfloat16': (
        torch.float32,
        functools.partial(torch.autocast, 'cpu', dtype=torch.bfloat16),
    ),
    'autocast float16': (
        torch.float32,
        functools.partial(torch.autocast, 'cpu', dtype=torch.float16),
    ),
    'bfloat16 weights': (torch.bfloat16, contextlib.nullcontext),
}


@torch.no_grad()
def precision_errors(build, shape) -> dict:
    torch.manual_seed(0)
    model = build()
    model.init_weights()
    model = perturb_(model).eval()
    x = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(1))
    reference = [o.double() for o in model(x)]
    result = {}
    for name, (dtype, context) in PRECISIONS.items():
        unfolded = copy.deepcopy(model).to(dtype)
        folded = reparameterize(copy.deepcopy(unfolded))
        with context():
            before = [o.double() for o in unfolded(x.to(dtype))]
            after = [o.double() for o in folded(x.to(dtype))]
        result[name] = dict(
            fold=errors(before, after)['rel'], precision=errors(reference, before)['rel']
        )
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--shape', nargs=2, type=int, default=(227, 301), metavar=('H', 'W'))
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args()
    MMLogger.get_current_instance().setLevel('WARNING')
    # bfloat16 / float16 arithmetic on the CPU depends on its extensions (avx512_bf16, amx_bf16)
    results = dict(
        shape=args.shape,
        command=' '.join(sys.argv),
        torch=torch.__version__,
        machine=machine_info(),
        backbones={},
    )
    print(
        f'input 1x3x{args.shape[0]}x{args.shape[1]}; relative errors: fold (folded vs '
        'unfolded) / precision (unfolded vs float32)'
    )
    print(f'{"":<44}' + ''.join(f'{p:>22}' for p in PRECISIONS))
    for name, build in {**BACKBONES, **MORE}.items():
        r = results['backbones'][name] = precision_errors(build, args.shape)
        print(
            f'{name:<44}'
            + ''.join(f'{v["fold"]:>11.1e} /{v["precision"]:>8.1e}' for v in r.values()),
            flush=True,
        )
    finish(results['machine'])
    if args.out:
        write_json(results, args.out)


if __name__ == '__main__':
    main()
