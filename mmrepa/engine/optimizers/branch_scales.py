"""The branch scales of RepOpt kernels: collecting them from a model and turning them into the
SGD gradient multiplier (the RepOptimizers paper's Grad Mult, §3.2, Eq. 3).

A module that takes part in gradient re-parameterization has a method
``repopt_branch_scales() -> Dict[nn.Parameter, Tensor]``. It maps its kernel ``W'``
(``C_out x C_in x 3 x 3``) to a tensor ``A`` of shape ``(K, *W'.shape)``, one slice per branch
of the imaginary CSLA block (``K <= 3``): ``A[k]`` is the constant scale ``alpha_k`` of branch
``k`` at every kernel entry and 0 where the branch does not cover the entry (3x3 branch:
``s_c`` everywhere; 1x1 branch: ``t_c`` at the centre tap; identity: 1.0 at the centre tap of
``c == d``). ``A`` is float32 (or float64), a constant, on the kernel's device.
"""

from collections import OrderedDict
from typing import Dict, Optional

import torch
import torch.nn as nn

BranchScales = Dict[nn.Parameter, torch.Tensor]

# dtypes that cannot hold the released multipliers: L2's smallest s^2 is 9.5e-12, below
# float16's smallest subnormal, and bfloat16 keeps 8 bits of mantissa
_TOO_NARROW = (torch.float16, torch.bfloat16)


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype the multipliers are built and applied in: the widest of ``dtypes``, at least
    float32 (float64 parameters get float64 multipliers, everything narrower float32)."""
    out = torch.float32
    for dtype in dtypes:
        out = torch.promote_types(out, dtype)
    return out


def check_branch_scales(param: nn.Parameter, scales: torch.Tensor, name: str = 'kernel') -> None:
    """Raise ``ValueError`` unless ``scales`` is a valid ``(K, *param.shape)`` scale tensor."""
    where = f'repopt_branch_scales() of {name!r}'
    if not isinstance(scales, torch.Tensor):
        raise ValueError(
            f'{where} returned a {type(scales).__name__}, expected a tensor of '
            f'shape (K, {", ".join(map(str, param.shape))})'
        )
    if scales.dim() != param.dim() + 1 or scales.shape[1:] != param.shape or scales.shape[0] < 1:
        raise ValueError(
            f'{where} has shape {tuple(scales.shape)}; expected (K, '
            f'{", ".join(map(str, param.shape))}) with K >= 1 branches, the '
            "kernel's shape after the branch dimension"
        )
    if not scales.is_floating_point() or scales.dtype in _TOO_NARROW:
        raise ValueError(
            f'{where} is {scales.dtype}; build the scales in float32 or float64 '
            '(small multipliers such as 1e-11 flush to 0 in half precision)'
        )
    if scales.requires_grad:
        raise ValueError(
            f'{where} requires grad: gradient re-parameterization needs constant '
            'scales (a target/CSLA layer); a model with trainable scales (the '
            'Hyper-Search model) is trained with a plain optimizer'
        )
    if not bool(torch.isfinite(scales).all()):
        raise ValueError(f'{where} contains inf or nan: check the scale file it was built from')


def collect_branch_scales(model: nn.Module) -> BranchScales:
    """Merge ``repopt_branch_scales()`` over every module of ``model``.

    Args:
        model: Any module; model wrappers (DDP) are walked like any module.

    Returns:
        ``{kernel parameter: A}`` in module order, each ``A`` of shape ``(K, *kernel.shape)``,
        validated (see :func:`check_branch_scales`). Empty if no module takes part.

    Raises:
        ValueError: A parameter is claimed by two modules (the multipliers would be ambiguous),
            a key is not a parameter of ``model``, or a scale tensor is malformed.
    """
    names = param_names(model)
    out: BranchScales = OrderedDict()
    owner: Dict[nn.Parameter, str] = {}
    for mod_name, module in model.named_modules():
        fn = getattr(module, 'repopt_branch_scales', None)
        # a wrapper that forwards attribute lookups (FSDP, activation checkpointing) finds
        # the method of the module it wraps: that module's, counted there
        if not callable(fn) or getattr(fn, '__self__', module) is not module:
            continue
        for param, scales in fn().items():
            name = names.get(param)
            if name is None:
                raise ValueError(
                    f'repopt_branch_scales() of module {mod_name!r} returned a '
                    f'tensor of shape {tuple(param.shape)} that is not a parameter '
                    'of the model; return the kernel nn.Parameter itself'
                )
            if param in out:
                raise ValueError(
                    f'parameter {name!r} has branch scales from both module '
                    f'{owner[param]!r} and module {mod_name!r}; only one module '
                    'may return scales for a kernel'
                )
            check_branch_scales(param, scales, name)
            out[param] = scales.detach()
            owner[param] = mod_name
    return out


def param_names(model: nn.Module) -> Dict[nn.Parameter, str]:
    """``{parameter: its name in model.named_parameters()}`` (first name of shared ones)."""
    names: Dict[nn.Parameter, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, name)
    return names


def branch_multiplier(scales: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The SGD gradient multiplier ``M = sum_k A[k]**2`` (the diagonal of ``J J^T``).

    Args:
        scales: ``(K, *kernel.shape)`` branch scales.
        dtype: Computed in this dtype (default: ``scales``' dtype, at least float32). Squaring
            float32 scales in float64 is exact.

    Returns:
        Tensor of ``kernel.shape``.
    """
    dtype = compute_dtype(scales.dtype) if dtype is None else dtype
    a = scales.to(dtype)
    return (a * a).sum(0)


def scales_of_piece(scales: torch.Tensor, start: int, end: int, shape) -> torch.Tensor:
    """The branch scales of a piece of a kernel: entries ``[start, end)`` of the flattened
    kernel, in the piece's ``shape`` (a copy: the whole kernel's scales are freed).

    A rank of sharded training holds such pieces. Every multiplier and every update acts on
    each kernel entry alone, so a piece updated with these scales is exactly the whole
    kernel's update, sliced.
    """
    k = scales.shape[0]
    return scales.reshape(k, -1)[:, start:end].reshape(k, *shape).clone()
