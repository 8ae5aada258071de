"""Feed-forward network with n parallel branches joined before the activation (the depth
re-parameterization paper's §3.3, Eqs. 8-9); folded by summing the branches once λ = 1."""

from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ...fold import FoldPolicy, Reparameterizable
from ...options import check_int
from ...registry import MODELS, build_activation_layer
from .branches import (
    BranchSumLinear,
    DiversityMixin,
    LambdaMixin,
    branch_diversity,
    branch_linear,
    init_slice_,
    unstack_ffn_branches,
)


@MODELS.register_module()
class JoinedFFN(DiversityMixin, LambdaMixin, Reparameterizable, BaseModule):
    """Feed-forward network with n parallel branches joined before the activation.

    Input and output: (..., d), no residual. Branch b computes ``z_b = v·W1_bᵀ + b1_b``
    (width h = mlp_ratio·d), its activation gets ``(1 - λ)·z_b + λ·Σ_c z_c`` (§3.3 Eq. 9, no
    rescaling) and it returns ``act(·)·W2_bᵀ + b2_b``; the layer returns the sum. At λ = 1
    (and in the folded layer) this is one FFN with ``W1 = Σ W1_b``, ``b1 = Σ b1_b``,
    ``W2 = Σ W2_b``, ``b2 = Σ b2_b``: FFN parameters drop by a factor n. The FFN joins the
    same way in both attention join modes. At λ = 1 the training forward runs that one FFN on
    the summed weights (same outputs and per-branch gradients, 1/n of the cost).

    Args:
        embed_dims (int): d.
        mlp_ratio (float): h / d. Default: 4.
        num_branches (int): n >= 1. Default: 2.
        act_cfg (dict): Activation (the paper: GELU, erf form). Default: ``dict(type='GELU')``.
        join_lambda (float): Initial λ in [0, 1]. Default: 0.
        deploy (bool): Build the folded FFN (``fc1``, ``act``, ``fc2``). Default: False.
        init_cfg (dict, optional): Initialization config.
    """

    fold_state_keys = ('fc1.weight', 'branch_fc1.weight')  # see mmrepa.fold.check_fold_state

    def __init__(
        self,
        embed_dims: int,
        mlp_ratio: float = 4.0,
        num_branches: int = 2,
        act_cfg: dict = dict(type='GELU'),
        join_lambda: float = 0.0,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        check_int(num_branches, 'num_branches')
        self.embed_dims, self.num_branches = embed_dims, num_branches
        self.hidden_dims = int(round(mlp_ratio * embed_dims))
        self.act = build_activation_layer(act_cfg)
        self.deploy = deploy
        d, h, n = embed_dims, self.hidden_dims, num_branches
        if deploy:
            self._build_folded()
            return
        self.branch_fc1 = nn.Linear(d, n * h)  # fan-in d: per-branch init
        self.branch_fc2 = BranchSumLinear(h, d, n)
        self._init_scheduled(join_lambda)

    def _build_folded(self, like: Optional[torch.Tensor] = None) -> None:
        factory = dict(device=like.device, dtype=like.dtype) if like is not None else {}
        self.fc1 = nn.Linear(self.embed_dims, self.hidden_dims, **factory)
        self.fc2 = nn.Linear(self.hidden_dims, self.embed_dims, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., d) -> (..., d), the sum of the branches' outputs (no residual)."""
        if self.deploy:
            return self.fc2(self.act(self.fc1(x)))
        lam = self._scheduled_for_forward()
        diversity = self._tracks_diversity()
        if (lam == 1.0 or self.num_branches == 1) and not diversity and self.fast_joined_forward:
            w1, b1, w2, b2 = self._folded_tensors()  # every branch activates the same Z
            return F.linear(self.act(F.linear(x, w1, b1)), w2, b2)
        return self._branches(x, joined=lam != 0.0, diversity=diversity)

    def _branches(self, x: torch.Tensor, joined: bool, diversity: bool = False) -> torch.Tensor:
        """The n branches in two GEMMs, the activations' inputs joined with the buffer's λ
        (``joined=False``: independent, λ = 0)."""
        n, h, lead = self.num_branches, self.hidden_dims, x.shape[:-1]
        z = self.branch_fc1(x)
        if joined:
            z = z.view(*lead, n, h)
            lam = self.join_lambda.to(z.dtype)
            z = ((1 - lam) * z + lam * z.sum(-2, keepdim=True)).view(*lead, n * h)
        if not diversity:
            return self.branch_fc2(self.act(z))
        per_branch = branch_linear(
            self.act(z).view(*lead, n, h),
            self.branch_fc2.weight.view(self.embed_dims, n, h),
            self.branch_fc2.bias,
        )
        self.branch_diversity = branch_diversity(per_branch)
        return per_branch.sum(-2)

    def _folded_tensors(self, dtype: Optional[torch.dtype] = None):
        cast = (lambda t: t) if dtype is None else (lambda t: t.to(dtype))
        d, h, n = self.embed_dims, self.hidden_dims, self.num_branches
        w1 = cast(self.branch_fc1.weight).view(n, h, d).sum(0)
        b1 = cast(self.branch_fc1.bias).view(n, h).sum(0)
        w2 = cast(self.branch_fc2.weight).view(d, n, h).sum(1)
        b2 = cast(self.branch_fc2.bias).sum(0)
        return w1, b1, w2, b2

    def describe(self) -> str:
        return f'{type(self).__name__}(num_branches={self.num_branches})'

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """One FFN, the branches summed; the fold refuses unless λ == 1.0 (or n == 1)."""
        names = ('fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias')
        return dict(zip(names, self._folded_tensors(dtype)))

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        like = self.branch_fc1.weight
        del self.branch_fc1, self.branch_fc2, self.join_lambda
        self._build_folded(like)

    @torch.no_grad()
    def reset_branch_parameters(self, method: str = 'xavier_uniform', std: float = 0.02):
        """Initialize every branch as its own ``fc1`` (h, d) and ``fc2`` (d, h) Linear
        (``'xavier_uniform'`` or ``'trunc_normal'``); biases 0."""
        if self.deploy:
            raise RuntimeError('reset_branch_parameters() needs the unfolded layer')
        d, h, n = self.embed_dims, self.hidden_dims, self.num_branches
        w1, w2 = self.branch_fc1.weight.view(n, h, d), self.branch_fc2.weight.view(d, n, h)
        for b in range(n):
            init_slice_(w1[b], (h, d), method, std)
            init_slice_(w2[:, b], (d, h), method, std)
        self.branch_fc1.bias.zero_()
        self.branch_fc2.bias.zero_()

    def branch_state_dicts(self) -> List[Dict[str, torch.Tensor]]:
        """Per-branch ``fc1.weight``/``fc1.bias``/``fc2.weight``/``fc2.bias`` (copies)."""
        if self.deploy:
            raise RuntimeError('a folded JoinedFFN has no branches any more')
        state = {k: v.detach() for k, v in self.state_dict().items()}
        return unstack_ffn_branches(state, self.num_branches)

    def extra_repr(self) -> str:
        lam = '' if self.deploy else f', join_lambda={self.scheduled_value:g}'
        return (
            f'embed_dims={self.embed_dims}, hidden_dims={self.hidden_dims}, '
            f'num_branches={self.num_branches}{lam}, deploy={self.deploy}'
        )
