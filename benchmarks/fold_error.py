"""How exact the folds are on full-size backbones, and how close ConvFormer / CAFormer are to timm.

    PYTHONPATH=. python benchmarks/fold_error.py [--shape 803 1333] [--out fold_error.json]

Weights are each family's own random initialisation with every 1-D parameter (norm weights and
biases, BatchNorm statistics, RepBN's eta, StarReLU's scale and bias, residual scales) moved
off its initial value, so that no fold term is invisible. The default input size is a multiple
of neither 32 nor the windows, so padding is exercised. Errors are the largest absolute
difference over the four outputs, and that divided by the largest output magnitude.
"""

import argparse
import copy

import timm
import torch
from mmengine.logging import MMLogger
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, ConvFormer, PRepBNSwin, RePaSwin
from mmrepa.checkpoint.loading import load_state_dict_checked
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info

BACKBONES = {
    'RePa-Swin-T': lambda: RePaSwin('tiny'),
    'RePa-Swin-B': lambda: RePaSwin('base'),
    'PRepBN-Swin-T': lambda: PRepBNSwin('tiny'),
    'SLAB-Swin-T (LLSS)': lambda: PRepBNSwin('tiny', attn_types='LLSS'),
    'CAFormer-M36 (windows 14/7)': lambda: CAFormer('m36', window_size=(None, None, 14, 7)),
    'RePa-CAFormer-M36 (windows 14/7)': lambda: CAFormer(
        'm36', idle_ratio=0.75, window_size=(None, None, 14, 7)
    ),
    'RePa-ConvFormer-S18': lambda: ConvFormer('s18', idle_ratio=0.75),
}
TIMM = {
    'ConvFormer-M36': (ConvFormer, 'convformer_m36', {}),
    'CAFormer-M36': (CAFormer, 'caformer_m36', dict(window_size=None)),
}


@torch.no_grad()
def perturb_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.dim() <= 1:
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    for m in model.modules():
        if isinstance(m, _BatchNorm):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


def errors(ref, out) -> dict:
    diff = max((r - o).abs().max().item() for r, o in zip(ref, out))
    scale = max(r.abs().max().item() for r in ref)
    return dict(max_abs=diff, rel=diff / scale, max_output=scale)


def fold_errors(build, shape) -> dict:
    torch.manual_seed(0)
    model = build()
    model.init_weights()
    model = perturb_(model).eval()
    result = {}
    for dtype in (torch.float64, torch.float32):  # each folded in its own precision
        model = model.to(dtype)
        folded = reparameterize(copy.deepcopy(model))
        x = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        with torch.no_grad():
            result[str(dtype)] = errors(model(x), folded(x))
    return result


def timm_errors(cls, timm_name, kwargs, shape) -> dict:
    torch.manual_seed(0)
    ref = perturb_(timm.create_model(timm_name, pretrained=False)).eval()
    ours = cls(timm_name.split('_')[1], **kwargs).eval()
    load_state_dict_checked(
        ours,
        ours.filter_checkpoint(ref.state_dict()),
        may_be_missing=['norm[0-9]*'],
        source=timm_name,
    )
    result = {}
    for dtype in (torch.float64, torch.float32):
        x = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        ref, ours = ref.to(dtype), ours.to(dtype)
        with torch.no_grad():
            feats = ref.forward_intermediates(x, intermediates_only=True)
            # timm's intermediates come before our output norms; apply ours (norm3 = timm's
            # head.norm, the others are identity at initialisation)
            expected = [
                getattr(ours, f'norm{i}')(f.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
                for i, f in enumerate(feats)
            ]
            result[str(dtype)] = errors(expected, ours(x))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--shape', nargs=2, type=int, default=(803, 1333), metavar=('H', 'W'))
    parser.add_argument(
        '--timm-shape',
        nargs=2,
        type=int,
        default=(511, 673),
        metavar=('H', 'W'),
        help='input of the timm parity check (global attention, as timm has it)',
    )
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args()
    MMLogger.get_current_instance().setLevel('WARNING')  # init_weights lists every tensor
    # float32 rounding follows the kernels torch dispatches to (AVX2, AVX-512, ...)
    results = dict(
        shape=args.shape,
        timm_shape=args.timm_shape,
        machine=machine_info(),
        fold={},
        timm_parity={},
    )
    print(f'fold error, input 1x3x{args.shape[0]}x{args.shape[1]}: max abs (relative)')
    for name, build in BACKBONES.items():
        r = results['fold'][name] = fold_errors(build, args.shape)
        print(
            f'  {name:<34} float64 {r["torch.float64"]["max_abs"]:.1e} '
            f'({r["torch.float64"]["rel"]:.1e})   float32 {r["torch.float32"]["max_abs"]:.1e} '
            f'({r["torch.float32"]["rel"]:.1e})',
            flush=True,
        )
    print(f'timm parity, input 1x3x{args.timm_shape[0]}x{args.timm_shape[1]}: max abs (relative)')
    for name, (cls, timm_name, kwargs) in TIMM.items():
        r = results['timm_parity'][name] = timm_errors(cls, timm_name, kwargs, args.timm_shape)
        print(
            f'  {name:<34} float64 {r["torch.float64"]["max_abs"]:.1e} '
            f'({r["torch.float64"]["rel"]:.1e})   float32 {r["torch.float32"]["max_abs"]:.1e} '
            f'({r["torch.float32"]["rel"]:.1e})',
            flush=True,
        )
    finish(results['machine'])
    if args.out:
        write_json(results, args.out)


if __name__ == '__main__':
    main()
