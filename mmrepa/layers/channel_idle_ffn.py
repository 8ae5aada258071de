"""The channel-idle FFN of RePaFormer (its §4.1, Eq. 3) and its exact three-matrix fold (§4.2)."""

import math
from typing import List, Optional

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..fold import (
    FoldPolicy,
    Reparameterizable,
    is_affine_norm,
    norm_affine,
    norm_fold_problems,
    weight_and_bias,
)
from ..registry import MODELS, build_activation_layer, build_norm_layer
from .output_affine import bare_activation, has_output_affine, output_affine


def num_active_channels(hidden_channels: int, idle_ratio: float) -> int:
    """``ceil(hidden * (1 - idle_ratio))``, robust to float noise (0.1 * 40 is not 4.0)."""
    if not 0.0 <= idle_ratio <= 1.0:
        raise ConfigError(f'idle_ratio must be in [0, 1], got {idle_ratio}')
    return min(hidden_channels, math.ceil(hidden_channels * (1.0 - idle_ratio) - 1e-9))


class _ActivateFirst(torch.autograd.Function):
    """In-place ``h[..., :a] = act(h[..., :a])`` whose backward writes one gradient tensor.

    The out-of-place form (slice, activate, ``cat``) costs a full-width copy forward and, in
    backward, a zero-filled full-width gradient per slice plus their sum: on a CPU that made
    the channel-idle FFN train slower than a plain FFN. Only the active slice is saved; its
    activation is recomputed in backward, which also yields the activation's parameter grads.
    """

    @staticmethod
    def forward(ctx, h, act, active, *act_params):
        pre = h[..., :active].clone()
        ctx.act, ctx.active = act, active
        ctx.save_for_backward(pre)
        if h._is_view():  # in place, autograd would rebase the view with a full-width copy
            h = h.clone()
        else:
            ctx.mark_dirty(h)
        h[..., :active] = act(pre)
        return h

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (pre,) = ctx.saved_tensors
        params = [p for p, need in zip(ctx.act.parameters(), ctx.needs_input_grad[3:]) if need]
        with torch.enable_grad():
            x = pre.detach().requires_grad_()
            grads = torch.autograd.grad(ctx.act(x), [x] + params, grad[..., : ctx.active])
        grad_h = grad.clone()
        grad_h[..., : ctx.active] = grads[0]
        param_grads = iter(grads[1:])
        return (
            grad_h,
            None,
            None,
            *(next(param_grads) if need else None for need in ctx.needs_input_grad[3:]),
        )


def activate_first_(act: nn.Module, h: torch.Tensor, active: int) -> torch.Tensor:
    """``act`` on the first ``active`` channels of ``h`` (..., hidden) in place, identity on
    the rest; returns ``h``. ``h`` must be a fresh tensor nothing else holds, such as the
    output of a linear layer; fastest when it is not a view (a 2-D linear output)."""
    if active == h.shape[-1]:
        return act(h)
    if active == 0:
        return h
    if torch.is_grad_enabled() and (
        h.requires_grad or any(p.requires_grad for p in act.parameters())
    ):
        return _ActivateFirst.apply(h, act, active, *act.parameters())
    h[..., :active] = act(h[..., :active])
    return h


def channels_last_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply ``norm`` over the last dim of ``x`` (..., C); BatchNorm sees (tokens, C)."""
    if isinstance(norm, _BatchNorm):
        return norm(x.reshape(-1, x.shape[-1])).view(x.shape)
    return norm(x)


@MODELS.register_module()
class ChannelIdleFFN(Reparameterizable, BaseModule):
    """Feed-forward network whose hidden channels are mostly idle (linear), RePaFormer style.

    Training structure, on tokens ``x`` of shape (..., C) with hidden width ``h = mlp_ratio * C``
    and ``a = ceil(h * (1 - idle_ratio))`` active channels::

        H   = fc1(norm1(x))
        H   = cat(act(H[..., :a]), H[..., a:])      # only the active slice is activated
        out = r * x + drop_path(c * g * fc2(norm2(H)))  # r: res_scale, g: layer_scale
                                                        # (or 1), c: branch_scale

    After :meth:`reparameterize` (or with ``deploy=True``) it computes the same function as
    ``[P, L] = x @ [W_a, W_lin]`` (one GEMM of width ``a + C``), ``out = L + act(P) @ W_out``
    (one GEMM from the active slice): the idle channels, both BatchNorms, the layer and branch
    scales and the shortcut with its residual scale (``diag(r)``) fold into ``W_lin``. An
    activation with an output affine (:class:`~mmrepa.backbones.metaformer.StarReLU`,
    ``s * relu(x)**2 + b``) folds ``s`` into ``W_out`` and ``b`` into the bias, and the folded
    FFN applies the bare activation.
    With a LayerNorm
    pre-norm (``norm_cfg=dict(type='LN')``) the norm and the (scaled) shortcut stay and the rest
    folds.

    Args:
        embed_dims (int): Channels C of the input and output.
        mlp_ratio (float): Hidden width as a multiple of C. Default: 4.
        idle_ratio (float): Fraction of hidden channels that skip the activation, in [0, 1].
            0 is a plain FFN (with the chosen norms), 1 a fully linear one. Default: 0.75.
        norm_cfg (dict): Norm before ``fc1``: ``BN1d`` (folds) or ``LN`` / ``GN1`` (kept;
            it sees the input's shape, e.g. the (B, H, W, C) map GroupNorm needs).
            Default: ``dict(type='BN1d')``.
        hidden_norm_cfg (dict | None): Norm on the hidden layer before ``fc2``; ``None`` for
            none. Default: ``dict(type='BN1d')``.
        act_cfg (dict): Activation of the active slice. Default: ``dict(type='GELU')``.
        bias (bool): Whether ``fc1`` and ``fc2`` have biases. Default: True.
        drop_rate (float): Dropout before ``fc2`` and after it. Default: 0.
        drop_path_rate (float): Stochastic depth on the residual branch. Default: 0.
        deploy (bool): Build the folded structure directly. Default: False.
        init_cfg (dict, optional): Initialization config.
        res_scale (bool): Scale the shortcut by a learnable per-channel ``res_scale`` (C,),
            initialised to 1 (MetaFormer's ResScale). Default: False.
        layer_scale_init (float, optional): Scale the branch by a learnable per-channel
            ``layer_scale`` (C,) initialised to this value (LayerScale); ``None`` for none.
            Default: None.
        branch_scale (float): A constant factor on the branch (LV-ViT divides each residual
            branch by ``skip_lam``: ``1 / skip_lam``); it folds into ``W_out`` as the layer
            scale does. Default: 1.
    """

    fold_state_keys = ('in_proj.weight', 'fc1.weight')  # see mmrepa.fold.check_fold_state
    shortcut_apart = False  # folded with FoldPolicy(identity_apart=True)

    def __init__(
        self,
        embed_dims: int,
        mlp_ratio: float = 4.0,
        idle_ratio: float = 0.75,
        norm_cfg: dict = dict(type='BN1d'),
        hidden_norm_cfg: Optional[dict] = dict(type='BN1d'),
        act_cfg: dict = dict(type='GELU'),
        bias: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        res_scale: bool = False,
        layer_scale_init: Optional[float] = None,
        branch_scale: float = 1.0,
    ):
        super().__init__(init_cfg=init_cfg)
        hidden = int(round(mlp_ratio * embed_dims))
        self.branch_scale = float(branch_scale)
        act = build_activation_layer(act_cfg)
        norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self._set_shape(
            embed_dims, hidden, num_active_channels(hidden, idle_ratio), act, norm1, res_scale
        )
        self.idle_ratio = idle_ratio
        if deploy:
            self.act = bare_activation(act)
            self._build_folded(
                keep_norm=None if self.prenorm_folds else norm1,
                **self._folded_biases(bias, hidden_norm_cfg is not None, bias),
            )
            self.deploy = True
            return
        self.act = act
        self.res_scale = nn.Parameter(torch.ones(embed_dims)) if res_scale else None
        self.layer_scale = (
            nn.Parameter(torch.full((embed_dims,), float(layer_scale_init)))
            if layer_scale_init is not None
            else None
        )
        self.norm1 = norm1
        self.fc1 = nn.Linear(embed_dims, hidden, bias=bias)
        self.norm2 = (
            build_norm_layer(hidden_norm_cfg, hidden)[1] if hidden_norm_cfg is not None else None
        )
        self.drop = nn.Dropout(drop_rate)
        self.fc2 = nn.Linear(hidden, embed_dims, bias=bias)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    def _set_shape(
        self,
        embed_dims: int,
        hidden: int,
        active: int,
        act: nn.Module,
        norm1: nn.Module,
        res_scale: bool,
    ) -> None:
        if not 0 <= active <= hidden:
            raise ValueError(f'active_channels must be in [0, {hidden}], got {active}')
        self.embed_dims = embed_dims
        self.hidden_channels = hidden
        self.active_channels = active
        self.deploy = False
        self.has_res_scale = res_scale
        self.act_has_output_affine = has_output_affine(act)
        # The pre-norm folds into fc1 only if it is affine at inference (BN, RepBN).
        self.prenorm_folds = is_affine_norm(norm1)

    @property
    def has_idle_channels(self) -> bool:
        return self.active_channels < self.hidden_channels

    @property
    def shortcut_folded(self) -> bool:
        """In the folded form, whether the shortcut lives inside ``in_proj``'s linear path
        (where it can, unless the fold kept it apart)."""
        return self.prenorm_folds and self.has_idle_channels and not self.shortcut_apart

    def _folded_biases(self, fc1_bias: bool, hidden_norm: bool, fc2_bias: bool) -> dict:
        """Which folded layers need a bias, decided from the structure (not the values), so
        that ``deploy=True`` builds what folding leaves, and no bias is zero by construction.
        """
        out_bias = (
            fc2_bias or hidden_norm or (self.act_has_output_affine and self.active_channels > 0)
        )
        in_bias = fc1_bias or self.prenorm_folds or (self.has_idle_channels and out_bias)
        return dict(in_bias=in_bias, out_bias=out_bias and not self.has_idle_channels)

    def _build_folded(
        self,
        keep_norm: Optional[nn.Module],
        in_bias: bool,
        out_bias: bool,
        like: Optional[torch.Tensor] = None,
    ):
        """Create the folded layers (uninitialised); ``like`` gives their device and dtype."""
        factory = dict(device=like.device, dtype=like.dtype) if like is not None else {}
        C, a = self.embed_dims, self.active_channels
        linear_width = C if self.has_idle_channels else 0
        self.norm1 = keep_norm
        self.in_proj = nn.Linear(C, a + linear_width, bias=in_bias, **factory)
        self.out_proj = nn.Linear(a, C, bias=out_bias, **factory) if a > 0 else None
        # A shortcut outside in_proj keeps its residual scale as a parameter.
        self.res_scale = (
            nn.Parameter(torch.ones(C, **factory))
            if self.has_res_scale and not self.shortcut_folded
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., C) -> (..., C), shortcut included."""
        if self.deploy:
            return self._forward_folded(x)
        # the norm sees x's own shape (a GroupNorm reads the whole map); fc1 a 2-D input, so
        # that its output is not a view
        tokens = channels_last_norm(self.norm1, x).reshape(-1, x.shape[-1])
        h = activate_first_(self.act, self.fc1(tokens), self.active_channels)
        if self.norm2 is not None:
            h = self.norm2(h)
        z = self.drop(self.fc2(self.drop(h)))
        if self.layer_scale is not None:
            z = z * self.layer_scale
        if self.branch_scale != 1.0:
            z = z * self.branch_scale
        return self._add_shortcut(self.drop_path(z.view(x.shape)), x)

    def _add_shortcut(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return z + x if self.res_scale is None else torch.addcmul(z, x, self.res_scale)

    def _forward_folded(self, x: torch.Tensor) -> torch.Tensor:
        shape, a = x.shape, self.active_channels
        y = x if self.norm1 is None else self.norm1(x)  # before flattening, as in forward
        x = x.reshape(-1, shape[-1])
        h = self.in_proj(y.reshape(-1, shape[-1]))
        if a == 0:
            out = h
        elif self.has_idle_channels:
            active = self.act(h[:, :a])
            if torch.onnx.is_in_onnx_export():
                # MatMul + Add: INT8 runtimes have no kernel for a Gemm whose C is a tensor
                # and would run out_proj in float32
                out = active @ self.out_proj.weight.t() + h[:, a:]
            else:  # linear path + act(active) @ W_out in one BLAS call
                out = torch.addmm(h[:, a:], active, self.out_proj.weight.t())
        else:
            out = self.out_proj(self.act(h))
        if not self.shortcut_folded:
            out = self._add_shortcut(out, x)
        return out.view(shape)

    def fold_problems(self) -> List[str]:
        """The norms the fold reads (an affine pre-norm, the hidden norm) must have finite
        running statistics; the hidden norm, between two matrices, must be affine."""
        problems = []
        if self.norm2 is not None and not is_affine_norm(self.norm2):
            problems.append(
                f'norm2 ({type(self.norm2).__name__}) normalizes each token, which '
                f'is not an affine map: a hidden norm must be a BatchNorm, RepBN or '
                f'PRepBN (hidden_norm_cfg) to fold'
            )
        return (
            problems
            + norm_fold_problems(self.norm1 if self.prenorm_folds else None, 'norm1')
            + norm_fold_problems(self.norm2, 'norm2')
        )

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """The three-matrix form (RePaFormer §4.2, Eqs. 6-7); ``policy.identity_apart`` leaves
        the shortcut out of ``in_proj`` (added after it, as when the pre-norm does not fold)."""
        a = self.active_channels
        fold_shortcut = self.shortcut_folded and not policy.identity_apart

        w_in, b_in = weight_and_bias(self.fc1, dtype)  # (h, C), (h,)
        if self.prenorm_folds:
            s1, t1 = norm_affine(self.norm1, dtype)
            w_in, b_in = w_in * s1, b_in + w_in @ t1
        w_out, b_out = weight_and_bias(self.fc2, dtype)  # (C, h), (C,)
        if self.norm2 is not None:
            s2, t2 = norm_affine(self.norm2, dtype)
            w_out, b_out = w_out * s2, b_out + w_out @ t2
        if self.layer_scale is not None:  # scales the rows of W_out and the bias
            g = self.layer_scale.to(dtype)
            w_out, b_out = w_out * g[:, None], b_out * g
        w_out, b_out = w_out * self.branch_scale, b_out * self.branch_scale
        affine = output_affine(self.act, dtype) if a > 0 else None
        if affine is not None:  # act = bare * s + b on the active slice
            s, b = affine
            b_out = b_out + b * w_out[:, :a].sum(1)
            w_out = torch.cat([w_out[:, :a] * s, w_out[:, a:]], dim=1)
        r = self.res_scale.to(dtype) if self.res_scale is not None else None

        tensors = {}
        if self.has_idle_channels:
            w_lin = w_out[:, a:] @ w_in[a:]
            if fold_shortcut:  # identity (or diag(r)) shortcut
                w_lin = w_lin + (
                    torch.diag(r)
                    if r is not None
                    else torch.eye(self.embed_dims, dtype=dtype, device=w_lin.device)
                )
            tensors['in_proj.weight'] = torch.cat([w_in[:a], w_lin])
            in_bias = torch.cat([b_in[:a], w_out[:, a:] @ b_in[a:] + b_out])
        else:
            tensors['in_proj.weight'], in_bias = w_in, b_in
        biases = self._biases_of_folded()
        if biases['in_bias']:
            tensors['in_proj.bias'] = in_bias
        if a > 0:
            tensors['out_proj.weight'] = w_out[:, :a]
            if biases['out_bias']:
                tensors['out_proj.bias'] = b_out
        if r is not None and not fold_shortcut:
            tensors['res_scale'] = r
        return tensors

    def _biases_of_folded(self) -> dict:
        return self._folded_biases(
            self.fc1.bias is not None, self.norm2 is not None, self.fc2.bias is not None
        )

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        like = self.fc1.weight
        keep_norm = None if self.prenorm_folds else self.norm1
        biases = self._biases_of_folded()
        for name in (
            'norm1',
            'fc1',
            'norm2',
            'drop',
            'fc2',
            'drop_path',
            'res_scale',
            'layer_scale',
        ):
            delattr(self, name)
        self.shortcut_apart = self.shortcut_folded and policy.identity_apart
        self.act = bare_activation(self.act)
        self._build_folded(keep_norm, like=like, **biases)

    def extra_repr(self) -> str:
        return (
            f'embed_dims={self.embed_dims}, hidden={self.hidden_channels}, '
            f'active={self.active_channels}, res_scale={self.has_res_scale}, '
            f'deploy={self.deploy}' + (', shortcut_apart=True' if self.shortcut_apart else '')
        )
