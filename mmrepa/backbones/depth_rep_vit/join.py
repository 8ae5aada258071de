"""Depth re-parameterization of ViT (SPEC-depth §7): n parallel branches per sub-layer, joined at
the inputs of the softmax and the GELU, folded into one single-path ViT block once λ = 1.

- :class:`JoinedAttention`: n attention branches joined pre-softmax (``join='logits'``, the
  paper's network; folds exactly into wider heads) or at their projections (``join='qkv'``,
  an mmrepa extension; folds into a standard ViT attention).
- :class:`JoinedFFN`: n FFN branches joined pre-activation; folds by summing.
- :class:`JoinedBlock`: both behind shared LayerNorms, with residuals and drop path (§7.2),
  global (with an optional key padding mask) or in windows with masked padding.

Branch tensors are stacked into one wide Linear per projection so that a forward is a handful
of GEMMs and one SDPA call, whatever n is. The stacked layouts (``B`` = branch, ``H`` = head,
``c`` = channel of a head) are fixed because the logit-join fold relies on them (§7.4.2):

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
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_

from ...errors import ConfigError
from ...fold import FoldPolicy, Reparameterizable
from ...layers.scheduled import ScheduledScalar
from ...layers.window_attention import attend_in_windows
from ...options import check_int, check_unit_interval, head_dim
from ...registry import MODELS, build_activation_layer, build_norm_layer

JOIN_MODES = ('logits', 'qkv')


def branch_diversity(outputs: torch.Tensor) -> torch.Tensor:
    """SPEC §7.3's diversity term: the mean over branch pairs b < c of cos²(f_b, f_c), the
    cosine per token over channels, averaged over the tokens and the batch.
    ``outputs`` (..., n, d) -> scalar."""
    n = outputs.shape[-2]
    f = F.normalize(outputs, dim=-1)
    gram = f @ f.transpose(-1, -2)
    rows, cols = torch.triu_indices(n, n, offset=1, device=outputs.device)
    return gram[..., rows, cols].square().mean()


def _branch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Branch b's output ``x_b · W_bᵀ + bias_b`` of every branch: x (..., n, k),
    weight (out, n, k), bias (n, out) -> (..., n, out)."""
    return torch.einsum('...bk,obk->...bo', x, weight) + bias


class _DiversityMixin:
    """Per-branch outputs for the diversity loss (SPEC §7.3, §7.8: a fused forward that only
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
    layers (SPEC §7.2: per-branch ``proj`` and ``fc2`` with biases), while the forward is one
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


class _LambdaMixin(ScheduledScalar):
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
                f'see different inputs, SPEC-depth §7.4). Finish the joining schedule (λ '
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


def _init_slice_(target: torch.Tensor, shape: Tuple[int, int], method: str, std: float) -> None:
    """Fill ``target`` (any view holding a (out, in) matrix's entries) as a fresh Linear."""
    fresh = torch.empty(shape, dtype=target.dtype, device=target.device)
    if method == 'xavier_uniform':
        nn.init.xavier_uniform_(fresh)
    elif method == 'trunc_normal':
        trunc_normal_(fresh, std=std)
    else:
        raise ValueError(f"method must be 'xavier_uniform' or 'trunc_normal', got {method!r}")
    target.copy_(fresh.view(target.shape))


# ----------------------------------------------------------------------------- attention


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
class JoinedAttention(_DiversityMixin, _LambdaMixin, Reparameterizable, BaseModule):
    """Multi-head self-attention with n parallel branches joined before the softmax.

    Input and output: (B, N, d); the shared LayerNorm is the caller's (:class:`JoinedBlock`).
    Each branch b has its own ``qkv`` (d -> 3d, H heads of d_h = d / H) and ``proj`` (d -> d)
    and the layer returns the sum of the branch outputs ``Σ_b O_b``.

    - ``join='logits'`` (the paper's network, SPEC §7.3): branch b's softmax gets
      ``((1 - λ)·A_b + λ·Σ_c A_c) / (√(1 + (n-1)λ²)·√d_h)`` per head, ``A_c = Q_c K_cᵀ``
      (biases included), and applies it to its own values. Computed without any per-branch
      N×N tensor: branch b's joined logits are ``Q̃_b K̃ᵀ`` with ``K̃ = [K_1|…|K_n]`` and
      ``Q̃_b`` = the ``Q_c`` scaled by 1 (c = b) or λ (c ≠ b), all branches in one SDPA call.
      At λ = 0 this is n ordinary attentions, at λ = 1 one attention of head width n·d_h,
      which is exactly the folded layer: ``qkv`` d -> 3nd, ``proj`` nd -> d, H heads of n·d_h
      (§7.4.2; parameters and MACs are not reduced).
    - ``join='qkv'`` (an mmrepa extension, **not the paper's network**, accuracy unmeasured,
      §7.4.3): q, k and v are joined, ``q_b <- (1 - λ)·q_b + λ·Σ_c q_c`` (likewise k, v), and
      the logits are divided by ``(1 + (n-1)λ²)·√d_h``. Folds into a standard attention
      (``W^Q = Σ_b W^Q_b / n``, ``W^K, W^V, W^O`` and biases summed), the paper's reported size.

    With a single branch both modes are a plain ViT attention whatever λ is. At λ = 1 (the
    post-joining phase) the training forward already runs the folded computation on weights
    summed from the branches on the fly: the same outputs and per-branch gradients as the
    joined formula, at the folded layer's cost. MACs: at λ = 0 and λ = 1 the SDPA costs
    2·N²·n·d (§7.7's training count); in between, the widened queries of the logit join make
    it N²·n·(n + 1)·d (the qkv join stays at 2·N²·n·d).

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
        per_branch = _branch_linear(
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
        """The widened-query form of SPEC §7.3: one SDPA over (B, H, n) of Q̃_b, K̃, V_b."""
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
            # rows make head h of width n·d_h = [Q_{1,h}|…|Q_{n,h}] (§7.4.2).
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
        ``'xavier_uniform'`` (MAE; with the fans of one branch, SPEC §7.8) or
        ``'trunc_normal'`` (DeiT, ``std``); biases 0. Independent draws per branch."""
        if self.deploy:
            raise RuntimeError('reset_branch_parameters() needs the unfolded layer')
        d, H, n, dh = self.embed_dims, self.num_heads, self.num_branches, self.head_dim
        qkv_w = self.branch_qkv.weight.view(3, H, n, dh, d)
        proj_w = self.branch_proj.weight.view(d, H, n, dh)
        for b in range(n):
            _init_slice_(qkv_w[:, :, b], (3 * d, d), method, std)
            _init_slice_(proj_w[:, :, b], (d, d), method, std)
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


# ----------------------------------------------------------------------------- FFN


@MODELS.register_module()
class JoinedFFN(_DiversityMixin, _LambdaMixin, Reparameterizable, BaseModule):
    """Feed-forward network with n parallel branches joined before the activation.

    Input and output: (..., d), no residual. Branch b computes ``z_b = v·W1_bᵀ + b1_b``
    (width h = mlp_ratio·d), its activation gets ``(1 - λ)·z_b + λ·Σ_c z_c`` (SPEC §7.3, no
    rescaling) and it returns ``act(·)·W2_bᵀ + b2_b``; the layer returns the sum. At λ = 1
    (and in the folded layer, §7.4.1) this is one FFN with ``W1 = Σ W1_b``, ``b1 = Σ b1_b``,
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
        per_branch = _branch_linear(
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
            _init_slice_(w1[b], (h, d), method, std)
            _init_slice_(w2[:, b], (d, h), method, std)
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


# ----------------------------------------------------------------------------- block


@MODELS.register_module()
class JoinedBlock(Reparameterizable, BaseModule):
    """A pre-norm ViT block whose two sub-layers have n joined branches (SPEC §7.2)::

        x = x + drop_path(attn(norm1(x)))     # Σ_b MHSA_b, joined pre-softmax (or at q/k/v)
        x = x + drop_path(mlp(norm2(x)))      # Σ_b FFN_b, joined pre-activation

    Both LayerNorms are shared by the branches and sit before the branch point (the only
    foldable reading); drop path acts on the summed sub-layer output, one mask per sample.
    :meth:`reparameterize` (λ == 1.0) gives a single-path block with timm's ViT names
    (``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``): a standard
    ViT block for ``join='qkv'`` or ``num_branches=1`` (timm / MAE-Lite block weights load
    into it unchanged), heads of width n·d_h for ``join='logits'``. The LayerNorms stay (their
    normalization is not linear); their affine is not folded, so the folded block keeps
    standard ViT shapes.

    Args:
        embed_dims (int): d.
        num_heads (int): H per branch. Default: 12 (the paper's ViT-Tiny; not timm's 3).
        num_branches (int): n >= 1. Default: 2.
        join (str): ``'logits'`` (the paper) or ``'qkv'`` (mmrepa's extension).
            Default: ``'logits'``.
        mlp_ratio (float): FFN hidden width / d. Default: 4.
        qkv_bias (bool): Bias on q, k, v. Default: True.
        drop_path_rate (float): Stochastic depth of both sub-layers. Default: 0.
        norm_cfg (dict): The shared norms. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): FFN activation. Default: ``dict(type='GELU')``.
        window_size (int, optional): Attend within non-overlapping windows of this side
            (``forward`` then needs ``hw_shape`` and tokens without a class token); the map is
            padded to multiples of the window and padded keys are masked, so any map size
            gives the same result folded and unfolded. ``None``: global. Default: None.
        join_lambda (float): Initial λ of both sub-layers. Default: 0.
        deploy (bool): Build the folded block. Default: False.
        init_cfg (dict, optional): Initialization config.

    ``forward(x, hw_shape=None, key_padding_mask=None)``: x (B, N, d) -> (B, N, d).
    ``key_padding_mask`` (B, N) bool, True for real tokens (global attention only): padding
    tokens are never attended to.
    """

    fold_state_keys = ('mlp.fc1.weight', 'mlp.branch_fc1.weight')  # names the block on load

    def __init__(
        self,
        embed_dims: int,
        num_heads: int = 12,
        num_branches: int = 2,
        join: str = 'logits',
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        act_cfg: dict = dict(type='GELU'),
        window_size: Optional[int] = None,
        join_lambda: float = 0.0,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        check_int(window_size, 'window_size', none_means='global attention')
        self.embed_dims, self.num_branches, self.join = embed_dims, num_branches, join
        self.window_size = window_size
        self.deploy = deploy
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.attn = JoinedAttention(
            embed_dims, num_heads, num_branches, join, qkv_bias, join_lambda, deploy
        )
        self.norm2 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp = JoinedFFN(embed_dims, mlp_ratio, num_branches, act_cfg, join_lambda, deploy)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    @property
    def current_join_lambda(self) -> float:
        return self.attn.current_join_lambda

    def set_join_lambda(self, value: float) -> None:
        """Set λ of both sub-layers (SPEC §7.3: one global λ for both joining points)."""
        self.attn.set_join_lambda(value)
        self.mlp.set_join_lambda(value)

    def forward(
        self,
        x: torch.Tensor,
        hw_shape: Optional[Tuple[int, int]] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        B, N, C = x.shape
        if self.window_size is None:
            mask = None
            if key_padding_mask is not None:
                if key_padding_mask.shape != (B, N) or key_padding_mask.dtype != torch.bool:
                    raise ValueError(
                        f'key_padding_mask must be a bool tensor of shape (B, N) '
                        f'= ({B}, {N}), True for real tokens; got '
                        f'{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}'
                    )
                mask = key_padding_mask[:, None, None, :]
            x = x + self.drop_path(self.attn(self.norm1(x), mask))
        else:
            if key_padding_mask is not None:
                raise ValueError(
                    'key_padding_mask is for global blocks; a windowed block masks '
                    'its own padding (pass hw_shape)'
                )
            x = x + self.drop_path(self._windowed_attention(self.norm1(x), hw_shape))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def _windowed_attention(self, u: torch.Tensor, hw_shape) -> torch.Tensor:
        B, N, C = u.shape
        if hw_shape is None or hw_shape[0] * hw_shape[1] != N:
            raise ValueError(
                f'a windowed JoinedBlock needs hw_shape=(H, W) with H * W = N = {N} '
                f'(patch tokens only, no class token); got hw_shape={hw_shape}'
            )
        # Padding tokens are zeros after the LN (which is not folded), but are masked as keys
        # anyway: no window may depend on how much padding it got.
        out = attend_in_windows(self.attn, u.view(B, *hw_shape, C), self.window_size)
        return out.reshape(B, N, C)

    def describe(self) -> str:
        return (
            f'{type(self).__name__}(embed_dims={self.embed_dims}, '
            f'num_branches={self.num_branches}, join={self.join!r})'
        )

    def extra_repr(self) -> str:
        return (
            f'num_branches={self.num_branches}, join={self.join!r}, '
            f'window_size={self.window_size}, deploy={self.deploy}'
        )
