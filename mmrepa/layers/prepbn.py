"""RepBN and progressive RepBN (PRepBN) of SLAB (its §4.1), on channels-last tokens (..., C)."""

import re
from typing import Dict, Tuple

import torch
import torch.nn as nn

from ..fold import batchnorm_affine
from ..registry import MODELS
from .scheduled import ScheduledScalar


@MODELS.register_module()
class RepBN(nn.Module):
    """``RepBN(x) = BN(x) + eta * x``: BatchNorm with a learnable identity path.

    The BatchNorm statistics are per channel over all tokens of the batch. In eval mode RepBN is
    the per-channel affine map ``x * (s + eta) + t`` (``s, t`` = the BatchNorm's scale and
    shift), which :meth:`eval_affine` returns so that folds can absorb it.

    Args:
        num_features (int): Channels C (the last dimension of the input).
        eps (float): BatchNorm epsilon. Default: 1e-5.
        momentum (float): BatchNorm momentum. Default: 0.1.

    Input and output: (..., C).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.bn = nn.BatchNorm1d(num_features, eps=eps, momentum=momentum)
        self.eta = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(x.reshape(-1, x.shape[-1])).view(x.shape)
        return y + self.eta * x

    def eval_affine(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(scale, shift)`` with ``self(x) == x * scale + shift`` in eval mode."""
        scale, shift = batchnorm_affine(self.bn, dtype)
        return scale + self.eta.to(dtype), shift


@MODELS.register_module()
class PRepBN(ScheduledScalar, nn.Module):
    """Progressive RepBN: ``lam * LN(x) + (1 - lam) * RepBN(x)`` while training.

    λ is a :class:`~mmrepa.layers.scheduled.ScheduledScalar` (buffer ``lam`` plus a host copy):
    saved in the state dict, restored on resume, set from outside with :meth:`set_lambda`
    (``PRepBNScheduleHook`` does it from the runner's iteration), never by the forward pass.
    Once λ = 0 the LayerNorm branch is not computed. The RepBN branch runs at every
    λ, so its running statistics track the features from the start.

    In eval mode the layer is pure RepBN whatever λ is: an affine map that folds into the
    neighbouring Linear or conv (:meth:`eval_affine`).

    Args:
        num_features (int): Channels C (the last dimension of the input).
        eps (float): Epsilon of both the LayerNorm and the BatchNorm. Default: 1e-5.
        momentum (float): BatchNorm momentum. Default: 0.1.
        lam (float): Initial λ in [0, 1]. Default: 1 (pure LayerNorm).

    Input and output: (..., C).
    """

    scheduled_name = 'lam'

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, lam: float = 1.0
    ):
        super().__init__()
        self.ln = nn.LayerNorm(num_features, eps=eps)
        self.repbn = RepBN(num_features, eps=eps, momentum=momentum)
        self._init_scheduled(lam)

    @property
    def current_lambda(self) -> float:
        return self.scheduled_value

    def set_lambda(self, value: float) -> None:
        self._set_scheduled(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lam = self.scheduled_value
        if not self.training or lam == 0.0:
            return self.repbn(x)
        return lam * self.ln(x) + (1.0 - lam) * self.repbn(x)

    def eval_affine(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(scale, shift)`` of the eval-mode layer (pure RepBN, λ plays no part)."""
        return self.repbn.eval_affine(dtype)

    def extra_repr(self) -> str:
        return f'{self.ln.normalized_shape[0]}, lam={self.scheduled_value:g}'


# SLAB's LinearNorm(norm1=LayerNorm, norm2=RepBN(bn, alpha)) with its step-counter buffers.
_LINEAR_NORM_KEY = re.compile(
    r'^(?P<prefix>.+)\.(?P<rest>norm1\.(weight|bias)|norm2\.bn\..+|norm2\.alpha|iter|total_step|warm)$'
)


def from_linear_norm(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """SLAB ``LinearNorm`` keys -> :class:`PRepBN` keys; λ = iter / total_step, or 1 while its
    LayerNorm-only warm-up (``warm`` iterations left) lasts.

    ``X.norm1.*`` is the LayerNorm branch, ``X.norm2.bn.*`` and ``X.norm2.alpha`` the RepBN;
    only prefixes that have a ``norm2.alpha`` are LinearNorms (a block's own ``norm1`` is not).
    """
    prefixes = {k[: -len('.norm2.alpha')] for k in state_dict if k.endswith('.norm2.alpha')}
    out, steps = {}, {}
    for k, v in state_dict.items():
        m = _LINEAR_NORM_KEY.match(k)
        if m is None or m['prefix'] not in prefixes:
            out[k] = v
            continue
        prefix, rest = m['prefix'], m['rest']
        if rest in ('iter', 'total_step', 'warm'):
            steps.setdefault(prefix, {})[rest] = float(v)
            continue
        rest = (
            rest.replace('norm1.', 'ln.', 1)
            if rest.startswith('norm1.')
            else rest.replace('norm2.bn.', 'repbn.bn.', 1)
            if rest.startswith('norm2.bn.')
            else 'repbn.eta'
        )
        out[f'{prefix}.{rest}'] = v
    for prefix, s in steps.items():
        if s.get('total_step'):
            lam = min(1.0, max(0.0, s.get('iter', 0.0) / s['total_step']))
            lam = 1.0 if s.get('warm', 0.0) > 0 else lam
            out[f'{prefix}.lam'] = torch.tensor(lam)
    return out
