"""What the joined layers of :mod:`.attention` and :mod:`.ffn` share: n branches stored stacked,
their λ and their diversity term.

Branch tensors are stacked into one wide Linear per projection so that a forward is a handful
of GEMMs and one SDPA call, whatever n is. The stacked layouts (``B`` = branch, ``H`` = head,
``c`` = channel of a head) are fixed because the logit-join fold relies on them (the heads of
the folded attention are n times wider, see :class:`~.attention.JoinedAttention`):

- ``branch_qkv.weight`` (3·n·d, d): rows ordered (q/k/v, H, B, c);
- ``branch_proj.weight`` (d, n·d): columns ordered (H, B, c); ``branch_proj.bias`` (n, d);
- ``branch_fc1.weight`` (n·h, d): rows ordered (B, hidden);
- ``branch_fc2.weight`` (d, n·h): columns ordered (B, hidden); ``branch_fc2.bias`` (n, d).

:func:`stack_attention_branches` / :func:`unstack_attention_branches` (and the FFN pair)
convert between these and per-branch timm-style ``qkv``/``proj``/``fc1``/``fc2`` tensors.
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model.weight_init import trunc_normal_

from ...errors import ConfigError
from ...layers.scheduled import ScheduledScalar
from ...options import check_unit_interval


def branch_diversity(outputs: torch.Tensor) -> torch.Tensor:
    """The paper's diversity term (§4, with Table 5): the mean over branch pairs b < c of
    cos²(f_b, f_c), the cosine per token over channels, averaged over the tokens and the batch.
    ``outputs`` (..., n, d) -> scalar."""
    n = outputs.shape[-2]
    f = F.normalize(outputs, dim=-1)
    gram = f @ f.transpose(-1, -2)
    rows, cols = torch.triu_indices(n, n, offset=1, device=outputs.device)
    return gram[..., rows, cols].square().mean()


def branch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Branch b's output ``x_b · W_bᵀ + bias_b`` of every branch: x (..., n, k),
    weight (out, n, k), bias (n, out) -> (..., n, out)."""
    return torch.einsum('...bk,obk->...bo', x, weight) + bias


class DiversityMixin:
    """Per-branch outputs for the diversity loss (the paper's §4: a fused forward that only
    returns the sum must still expose them). With ``track_branch_diversity = True`` every
    training forward of a multi-branch layer stores :func:`branch_diversity` of its branch
    outputs in ``branch_diversity`` (a tensor with grad) for the owner to collect; the fast
    λ = 1 path (which never forms the branch outputs) is then skipped. Training only."""

    track_branch_diversity = False
    branch_diversity: Optional[torch.Tensor] = None

    def _tracks_diversity(self) -> bool:
        return self.track_branch_diversity and self.training and self.num_branches > 1


class BranchSumLinear(nn.Module):
    """n Linear layers whose outputs are summed: ``y = Σ_b x_b · W_bᵀ + bias_b``.

    ``x`` (..., n · in_features) holds the n branch inputs side by side, in a column order
    the owner chooses (``weight`` (out, n · in) follows it). Each branch keeps its own bias,
    so the parameters, their count and their optimizer steps are those of n separate Linear
    layers (the paper's §3.4: per-branch ``proj`` and ``fc2`` with biases), while the forward is one
    GEMM. ``bias`` is (n, out); the forward adds its sum.
    """

    def __init__(self, in_features: int, out_features: int, num_branches: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.num_branches = num_branches
        self.weight = nn.Parameter(torch.empty(out_features, num_branches * in_features))
        self.bias = nn.Parameter(torch.empty(num_branches, out_features)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """PyTorch's Linear initialization of every branch with its own fan-in (``in``, not
        ``n · in``: a stacked fan would shrink the weights by √n)."""
        bound = 1.0 / math.sqrt(self.in_features)
        # kaiming_uniform(a=sqrt(5)) of nn.Linear is U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        self.weight.uniform_(-bound, bound)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound)

    def summed_bias(self) -> Optional[torch.Tensor]:
        return None if self.bias is None else self.bias.sum(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.summed_bias())

    def extra_repr(self) -> str:
        return (
            f'in_features={self.in_features}, out_features={self.out_features}, '
            f'num_branches={self.num_branches}, bias={self.bias is not None}'
        )


class LambdaMixin(ScheduledScalar):
    """λ as a :class:`~mmrepa.layers.scheduled.ScheduledScalar`: the buffer ``join_lambda``
    (saved in checkpoints, copied by EMA) plus a host copy that training branches on. The
    joined forward uses λ as a tensor, so a compiled model does not recompile at every step of
    the ramp.

    ``fast_joined_forward`` (True): at λ = 1 (or with one branch) the forward runs the folded
    computation on weights summed from the branches on the fly. False computes the n
    branches and their join as at any other λ, without the arithmetic the fold shares with
    that fast path: the reference a fold is checked against (slower, the same function).
    """

    scheduled_name = 'join_lambda'
    fast_joined_forward = True

    @property
    def current_join_lambda(self) -> float:
        """λ of the training form (1.0 once folded: the folded form is the λ = 1 network)."""
        if self.deploy:
            return 1.0
        return float(self.join_lambda)

    def set_join_lambda(self, value: float) -> None:
        """Set λ in [0, 1] (the joining schedule calls this before every iteration)."""
        if not self.deploy:
            self._set_scheduled(value)
        elif check_unit_interval(value, f'{type(self).__name__}: join_lambda') != 1.0:
            raise ConfigError(
                f'{type(self).__name__} is folded (deploy=True), i.e. the λ = 1 network; '
                f'it cannot run at join_lambda={value}. Build the model with deploy=False '
                f'to train through the joining schedule.'
            )

    def fold_problems(self) -> List[str]:
        """The fold is exact only at λ == 1.0 (or with a single branch, whose output does not
        depend on λ)."""
        if self.deploy:
            return []
        lam = float(self.join_lambda)
        if self.num_branches > 1 and lam != 1.0:
            return [
                f'join_lambda = {lam!r}; its {self.num_branches} branches fold exactly only '
                f'at join_lambda = 1.0 (below it the nonlinearities of different branches '
                f'see different inputs: §3.3 of the paper). Finish the joining schedule (λ '
                f'must reach exactly 1.0) and train on at λ = 1 before folding; a checkpoint '
                f'saved mid-ramp cannot be folded.'
            ]
        return []


# ----------------------------------------------------------------------------- layouts


def stack_attention_branches(
    branches: Sequence[Dict[str, torch.Tensor]], num_heads: int
) -> Dict[str, torch.Tensor]:
    """Per-branch timm-style attention tensors -> :class:`JoinedAttention`'s stacked ones.

    Each branch: ``qkv.weight`` (3d, d) with rows (q/k/v, head, channel), optional
    ``qkv.bias`` (3d,), ``proj.weight`` (d, d), ``proj.bias`` (d,). Returns
    ``branch_qkv.weight``/``.bias`` and ``branch_proj.weight``/``.bias`` (names relative to
    the attention module), in the head-interleaved order of the module docstring.
    """
    n, H = len(branches), num_heads
    d = branches[0]['proj.weight'].shape[0]
    dh = d // H
    qkv_w = torch.stack([b['qkv.weight'].reshape(3, H, dh, d) for b in branches], dim=2)
    proj_w = torch.stack([b['proj.weight'].reshape(d, H, dh) for b in branches], dim=2)
    out = {
        'branch_qkv.weight': qkv_w.reshape(3 * n * d, d),
        'branch_proj.weight': proj_w.reshape(d, n * d),
        'branch_proj.bias': torch.stack([b['proj.bias'] for b in branches]),
    }
    if branches[0].get('qkv.bias') is not None:
        qkv_b = torch.stack([b['qkv.bias'].reshape(3, H, dh) for b in branches], dim=2)
        out['branch_qkv.bias'] = qkv_b.reshape(3 * n * d)
    return out


def unstack_attention_branches(
    state: Dict[str, torch.Tensor], num_heads: int, num_branches: int
) -> List[Dict[str, torch.Tensor]]:
    """Inverse of :func:`stack_attention_branches` (copies)."""
    H, n = num_heads, num_branches
    qkv_w, proj_w = state['branch_qkv.weight'], state['branch_proj.weight']
    d = proj_w.shape[0]
    dh = d // H
    qkv_w = qkv_w.reshape(3, H, n, dh, d)
    proj_w = proj_w.reshape(d, H, n, dh)
    qkv_b = state.get('branch_qkv.bias')
    qkv_b = None if qkv_b is None else qkv_b.reshape(3, H, n, dh)
    out = []
    for b in range(n):
        branch = {
            'qkv.weight': qkv_w[:, :, b].reshape(3 * d, d).clone(),
            'proj.weight': proj_w[:, :, b].reshape(d, d).clone(),
            'proj.bias': state['branch_proj.bias'][b].clone(),
        }
        if qkv_b is not None:
            branch['qkv.bias'] = qkv_b[:, :, b].reshape(3 * d).clone()
        out.append(branch)
    return out


def stack_ffn_branches(branches: Sequence[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Per-branch ``fc1``/``fc2`` tensors -> :class:`JoinedFFN`'s ``branch_fc1``/``branch_fc2``."""
    return {
        'branch_fc1.weight': torch.cat([b['fc1.weight'] for b in branches]),
        'branch_fc1.bias': torch.cat([b['fc1.bias'] for b in branches]),
        'branch_fc2.weight': torch.cat([b['fc2.weight'] for b in branches], dim=1),
        'branch_fc2.bias': torch.stack([b['fc2.bias'] for b in branches]),
    }


def unstack_ffn_branches(
    state: Dict[str, torch.Tensor], num_branches: int
) -> List[Dict[str, torch.Tensor]]:
    """Inverse of :func:`stack_ffn_branches` (copies)."""
    n = num_branches
    w1, b1 = state['branch_fc1.weight'].chunk(n), state['branch_fc1.bias'].chunk(n)
    w2 = state['branch_fc2.weight'].chunk(n, dim=1)
    return [
        {
            'fc1.weight': w1[b].clone(),
            'fc1.bias': b1[b].clone(),
            'fc2.weight': w2[b].clone(),
            'fc2.bias': state['branch_fc2.bias'][b].clone(),
        }
        for b in range(n)
    ]


def init_slice_(target: torch.Tensor, shape: Tuple[int, int], method: str, std: float) -> None:
    """Fill ``target`` (any view holding a (out, in) matrix's entries) as a fresh Linear."""
    fresh = torch.empty(shape, dtype=target.dtype, device=target.device)
    if method == 'xavier_uniform':
        nn.init.xavier_uniform_(fresh)
    elif method == 'trunc_normal':
        trunc_normal_(fresh, std=std)
    else:
        raise ValueError(f"method must be 'xavier_uniform' or 'trunc_normal', got {method!r}")
    target.copy_(fresh.view(target.shape))
