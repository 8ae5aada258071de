"""Multi-head self-attention with n parallel branches joined before the softmax (the depth
re-parameterization paper's §3.3, Eqs. 4-5), or at q, k and v (``join='qkv'``, an mmrepa
extension); folded once λ = 1. The stacked tensor layouts are in :mod:`.branches`."""

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from ...errors import ConfigError
from ...fold import FoldPolicy, Reparameterizable
from ...options import check_int, head_dim
from ...registry import MODELS
from .branches import (
    BranchSumLinear,
    DiversityMixin,
    LambdaMixin,
    branch_diversity,
    branch_linear,
    init_slice_,
    unstack_attention_branches,
)

JOIN_MODES = ('logits', 'qkv')


def _check_attn_mask(mask: Optional[torch.Tensor], B: int, N: int) -> None:
    if mask is None:
        return
    if (
        mask.dim() != 4
        or mask.shape[1] != 1
        or mask.shape[0] not in (1, B)
        or mask.shape[2] not in (1, N)
        or mask.shape[3] != N
    ):
        raise ValueError(
            f'attn_mask must have shape (B or 1, 1, N or 1, N) = ({B} or 1, 1, {N} or 1, {N}) '
            f'(one mask for all heads and branches; True or 0 where a query may attend a key), '
            f'got {tuple(mask.shape)}'
        )


@MODELS.register_module()
class JoinedAttention(DiversityMixin, LambdaMixin, Reparameterizable, BaseModule):
    """Multi-head self-attention with n parallel branches joined before the softmax.

    Input and output: (B, N, d); the shared LayerNorm is the caller's (:class:`JoinedBlock`).
    Each branch b has its own ``qkv`` (d -> 3d, H heads of d_h = d / H) and ``proj`` (d -> d)
    and the layer returns the sum of the branch outputs ``Σ_b O_b``.

    - ``join='logits'`` (the paper's network, §3.3 Eq. 5): branch b's softmax gets
      ``((1 - λ)·A_b + λ·Σ_c A_c) / (√(1 + (n-1)λ²)·√d_h)`` per head, ``A_c = Q_c K_cᵀ``
      (biases included), and applies it to its own values. Computed without any per-branch
      N×N tensor: branch b's joined logits are ``Q̃_b K̃ᵀ`` with ``K̃ = [K_1|…|K_n]`` and
      ``Q̃_b`` = the ``Q_c`` scaled by 1 (c = b) or λ (c ≠ b), all branches in one SDPA call.
      At λ = 0 this is n ordinary attentions, at λ = 1 one attention of head width n·d_h,
      which is exactly the folded layer: ``qkv`` d -> 3nd, ``proj`` nd -> d, H heads of n·d_h
      (not the paper's Eqs. 6-7, which are not exact; parameters and MACs are not reduced).
    - ``join='qkv'`` (an mmrepa extension, **not the paper's network**, accuracy unmeasured):
      q, k and v are joined, ``q_b <- (1 - λ)·q_b + λ·Σ_c q_c`` (likewise k, v), and
      the logits are divided by ``(1 + (n-1)λ²)·√d_h``. Folds into a standard attention
      (``W^Q = Σ_b W^Q_b / n``, ``W^K, W^V, W^O`` and biases summed), the paper's reported size.

    With a single branch both modes are a plain ViT attention whatever λ is. At λ = 1 (the
    post-joining phase) the training forward already runs the folded computation on weights
    summed from the branches on the fly: the same outputs and per-branch gradients as the
    joined formula, at the folded layer's cost. MACs: at λ = 0 and λ = 1 the SDPA costs
    2·N²·n·d (the training count of docs/backbones/depth_rep_vit.md#sizes); in between, the
    widened queries of the logit join make it N²·n·(n + 1)·d (the qkv join stays at 2·N²·n·d).

    Args:
        embed_dims (int): d.
        num_heads (int): H per branch (ViT-Tiny as the paper: 12). Default: 12.
        num_branches (int): n >= 1. Default: 2.
        join (str): ``'logits'`` or ``'qkv'``. Default: ``'logits'``.
        qkv_bias (bool): Bias on q, k, v. Default: True.
        join_lambda (float): Initial λ in [0, 1]. Default: 0 (independent branches).
        deploy (bool): Build the folded layer (``qkv``, ``proj``). Default: False.
        init_cfg (dict, optional): Initialization config.

    ``forward(x, attn_mask=None)``: ``attn_mask`` (B or 1, 1, N or 1, N), bool (True =
    may attend) or additive float, as ``scaled_dot_product_attention`` takes it; one mask for
    every head and branch (e.g. a key padding mask ``valid[:, None, None, :]``).
    """

    fold_state_keys = ('qkv.weight', 'branch_qkv.weight')  # see mmrepa.fold.check_fold_state

    def __init__(
        self,
        embed_dims: int,
        num_heads: int = 12,
        num_branches: int = 2,
        join: str = 'logits',
        qkv_bias: bool = True,
        join_lambda: float = 0.0,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if join not in JOIN_MODES:
            raise ConfigError(
                f"join must be 'logits' (the paper's network) or 'qkv' (mmrepa's "
                f'standard-shape extension), got {join!r}'
            )
        check_int(num_branches, 'num_branches')
        self.embed_dims, self.num_heads, self.num_branches = embed_dims, num_heads, num_branches
        self.head_dim = head_dim(embed_dims, num_heads)  # of one branch
        self.join = join
        self.qkv_bias = qkv_bias
        self.deploy = deploy
        d, n = embed_dims, num_branches
        if deploy:
            self._build_folded()
            return
        self.branch_qkv = nn.Linear(d, 3 * n * d, bias=qkv_bias)  # fan-in d: per-branch init
        self.branch_proj = BranchSumLinear(d, d, n)
        self._init_scheduled(join_lambda)

    @property
    def folded_width(self) -> int:
        """Attention width w of the folded layer: n·d (logit join) or d (qkv join)."""
        return self.num_branches * self.embed_dims if self.join == 'logits' else self.embed_dims

    def _build_folded(self, like: Optional[torch.Tensor] = None) -> None:
        factory = dict(device=like.device, dtype=like.dtype) if like is not None else {}
        w = self.folded_width
        self.qkv = nn.Linear(self.embed_dims, 3 * w, bias=self.qkv_bias, **factory)
        self.proj = nn.Linear(w, self.embed_dims, **factory)

    # -- forward

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None):
        """x (B, N, d) -> (B, N, d), the sum of the branches' outputs (no residual)."""
        B, N, _ = x.shape
        _check_attn_mask(attn_mask, B, N)
        if self.deploy:
            return self._attend(
                x, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias, attn_mask
            )
        lam = self._scheduled_for_forward()
        diversity = self._tracks_diversity()
        if (lam == 1.0 or self.num_branches == 1) and not diversity and self.fast_joined_forward:
            # Every branch sees the same softmax input: the folded computation, with the
            # folded tensors formed from the branch parameters (differentiably).
            return self._attend(x, *self._folded_tensors(), attn_mask)
        if self.join == 'logits' and lam != 0.0:
            out = self._joined_logits(x, attn_mask)
        else:  # qkv join at any λ < 1, or independent branches (λ = 0)
            out = self._per_branch(x, attn_mask, joined_qkv=self.join == 'qkv' and lam != 0.0)
        if not diversity:
            return self.branch_proj(out)
        H, n, dh, d = self.num_heads, self.num_branches, self.head_dim, self.embed_dims
        # proj's columns are (H, n, c): regroup them by branch
        per_branch = branch_linear(
            out.view(B, N, H, n, dh).transpose(2, 3).reshape(B, N, n, H * dh),
            self.branch_proj.weight.view(d, H, n, dh).transpose(1, 2).reshape(d, n, H * dh),
            self.branch_proj.bias,
        )
        self.branch_diversity = branch_diversity(per_branch)
        return per_branch.sum(-2)

    def _attend(self, x, qkv_w, qkv_b, proj_w, proj_b, attn_mask):
        """Plain multi-head attention (scale 1 / √head width) with the given tensors."""
        B, N, _ = x.shape
        q, k, v = F.linear(x, qkv_w, qkv_b).view(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return F.linear(out.transpose(1, 2).reshape(B, N, -1), proj_w, proj_b)

    def _branch_qkv(self, x):
        B, N, _ = x.shape
        # (3, B, H, n, N, d_h)
        return (
            self.branch_qkv(x)
            .view(B, N, 3, self.num_heads, self.num_branches, self.head_dim)
            .permute(2, 0, 3, 4, 1, 5)
        )

    def _per_branch(self, x, attn_mask, joined_qkv: bool):
        """n·H attentions of width d_h in one SDPA call (qkv join: on the joined q, k, v)."""
        B, N, _ = x.shape
        H, n, dh = self.num_heads, self.num_branches, self.head_dim
        q, k, v = self._branch_qkv(x)  # each (B, H, n, N, d_h)
        scale = 1.0 / math.sqrt(dh)
        if joined_qkv:
            lam = self.join_lambda.to(x.dtype)
            q, k, v = ((1 - lam) * t + lam * t.sum(2, keepdim=True) for t in (q, k, v))
            # q and k both grow: the logit std grows by (1 + (n-1)λ²), not its root
            q = q * (scale / (1 + (n - 1) * lam * lam))
            scale = 1.0
        out = F.scaled_dot_product_attention(
            q.reshape(B, H * n, N, dh),
            k.reshape(B, H * n, N, dh),
            v.reshape(B, H * n, N, dh),
            attn_mask=attn_mask,
            scale=scale,
        )
        # (B, H·n, N, d_h) -> (B, N, H, n, d_h): proj's column order
        return out.view(B, H, n, N, dh).permute(0, 3, 1, 2, 4).reshape(B, N, n * H * dh)

    def _joined_logits(self, x, attn_mask):
        """The logit join (§3.3 Eq. 5) as widened queries: one SDPA over (B, H, n) of Q̃_b, K̃,
        V_b."""
        B, N, _ = x.shape
        H, n, dh = self.num_heads, self.num_branches, self.head_dim
        q, k, v = self._branch_qkv(x)  # each (B, H, n, N, d_h)
        lam = self.join_lambda.to(x.dtype)
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        # coef[b, c]: weight of Q_c in Q̃_b, with the variance correction folded in
        coef = ((1 - lam) * eye + lam) / (torch.sqrt(1 + (n - 1) * lam * lam) * math.sqrt(dh))
        q = q.transpose(2, 3)  # (B, H, N, n_c, d_h)
        q_wide = (q.unsqueeze(2) * coef.view(1, 1, n, 1, n, 1)).flatten(-2)  # (B,H,n_b,N,n·d_h)
        k_wide = k.transpose(2, 3).flatten(-2).unsqueeze(2).expand(B, H, n, N, n * dh)
        mask = attn_mask.unsqueeze(2) if attn_mask is not None else None
        out = F.scaled_dot_product_attention(q_wide, k_wide, v, attn_mask=mask, scale=1.0)
        return out.permute(0, 3, 1, 2, 4).reshape(B, N, n * H * dh)

    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """Each branch's post-softmax attention on x (B, N, d): (B, H, n, N, N), written out
        (for attention distillation; the forward never forms them). Folded: n = 1."""
        B, N, _ = x.shape
        H, n, dh = self.num_heads, self.num_branches, self.head_dim
        if self.deploy:
            q, k, _ = F.linear(x, self.qkv.weight, self.qkv.bias).view(B, N, 3, H, 1, -1).unbind(2)
            q, k = q.permute(0, 2, 3, 1, 4), k.permute(0, 2, 3, 1, 4)  # (B, H, 1, N, w)
            return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        q, k, _ = self._branch_qkv(x)  # each (B, H, n, N, d_h)
        lam = self.join_lambda.to(x.dtype)
        if self.join == 'qkv':
            q, k = ((1 - lam) * t + lam * t.sum(2, keepdim=True) for t in (q, k))
            logits = q @ k.transpose(-1, -2) / ((1 + (n - 1) * lam * lam) * math.sqrt(dh))
        else:
            raw = q @ k.transpose(-1, -2)
            mixed = (1 - lam) * raw + lam * raw.sum(2, keepdim=True)
            logits = mixed / (torch.sqrt(1 + (n - 1) * lam * lam) * math.sqrt(dh))
        return torch.softmax(logits, dim=-1)

    # -- folding

    def _folded_tensors(self, dtype: Optional[torch.dtype] = None):
        """(qkv weight, qkv bias, proj weight, proj bias) of the folded layer, from the branch
        parameters (in ``dtype`` if given; differentiable unless called under no_grad)."""
        cast = (lambda t: t) if dtype is None else (lambda t: t.to(dtype))
        d, H, n, dh = self.embed_dims, self.num_heads, self.num_branches, self.head_dim
        qkv_w = cast(self.branch_qkv.weight)
        qkv_b = None if self.branch_qkv.bias is None else cast(self.branch_qkv.bias)
        proj_w = cast(self.branch_proj.weight)
        proj_b = cast(self.branch_proj.bias).sum(0)
        if self.join == 'logits':
            # The stacked layout already is the folded one: (q/k/v, head, branch, channel)
            # rows make head h of width n·d_h = [Q_{1,h}|…|Q_{n,h}].
            return qkv_w, qkv_b, proj_w, proj_b
        # qkv join: sum the branches; 1/n on q absorbs the λ = 1 logit divisor n·√d_h.
        q_scale = qkv_w.new_tensor([1.0 / n, 1.0, 1.0])
        qkv_w = (qkv_w.view(3, H, n, dh, d).sum(2) * q_scale.view(3, 1, 1, 1)).reshape(3 * d, d)
        if qkv_b is not None:
            qkv_b = (qkv_b.view(3, H, n, dh).sum(2) * q_scale.view(3, 1, 1)).reshape(3 * d)
        proj_w = proj_w.view(d, H, n, dh).sum(2).reshape(d, d)
        return qkv_w, qkv_b, proj_w, proj_b

    def describe(self) -> str:
        return f'{type(self).__name__}(num_branches={self.num_branches}, join={self.join!r})'

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """One attention (wider heads for ``'logits'``, a standard one for ``'qkv'``); the
        fold refuses unless λ == 1.0 (or n == 1): :meth:`fold_problems`."""
        names = ('qkv.weight', 'qkv.bias', 'proj.weight', 'proj.bias')
        return {k: t for k, t in zip(names, self._folded_tensors(dtype)) if t is not None}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        like = self.branch_qkv.weight
        del self.branch_qkv, self.branch_proj, self.join_lambda
        self._build_folded(like)

    @torch.no_grad()
    def reset_branch_parameters(self, method: str = 'xavier_uniform', std: float = 0.02):
        """Initialize every branch as its own ``qkv`` (3d, d) and ``proj`` (d, d) Linear:
        ``'xavier_uniform'`` (MAE; with the fans of one branch, not of the stack) or
        ``'trunc_normal'`` (DeiT, ``std``); biases 0. Independent draws per branch."""
        if self.deploy:
            raise RuntimeError('reset_branch_parameters() needs the unfolded layer')
        d, H, n, dh = self.embed_dims, self.num_heads, self.num_branches, self.head_dim
        qkv_w = self.branch_qkv.weight.view(3, H, n, dh, d)
        proj_w = self.branch_proj.weight.view(d, H, n, dh)
        for b in range(n):
            init_slice_(qkv_w[:, :, b], (3 * d, d), method, std)
            init_slice_(proj_w[:, :, b], (d, d), method, std)
        if self.branch_qkv.bias is not None:
            self.branch_qkv.bias.zero_()
        self.branch_proj.bias.zero_()

    def branch_state_dicts(self) -> List[Dict[str, torch.Tensor]]:
        """Per-branch timm-style tensors (``qkv.weight``, ``qkv.bias``, ``proj.weight``,
        ``proj.bias``), copies; see :func:`unstack_attention_branches`."""
        if self.deploy:
            raise RuntimeError('a folded JoinedAttention has no branches any more')
        state = {k: v.detach() for k, v in self.state_dict().items()}
        return unstack_attention_branches(state, self.num_heads, self.num_branches)

    def extra_repr(self) -> str:
        lam = '' if self.deploy else f', join_lambda={self.scheduled_value:g}'
        return (
            f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, '
            f'num_branches={self.num_branches}, join={self.join!r}{lam}, '
            f'deploy={self.deploy}'
        )
