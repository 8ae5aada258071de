"""The layers of RepOpt-VGG (RepOptimizers): one 3x3 conv-BN-ReLU in three training forms.

- :class:`RepOptConvBN`, the *target*: the plain layer a RepOptimizer trains. Its gradient is
  multiplied by constants that make it train as the CSLA block would (the RepOptimizers
  paper's §3.2, Eqs. 2-3).
- :class:`CSLAConvBN`, the block it emulates: ``BN(s ⊙ conv3x3(x) + t ⊙ conv1x1(x) + i ⊙ x)``.
  In Hyper-Search (``trainable_scales=True``) s, t and i are learned; as the CSLA reference s and t
  are constants.
- :class:`RepVGGConvBN`, the RepVGG baseline: 3x3-BN + 1x1-BN + BN(identity).

All three fold (eval mode) into the same inference layer, ``ReLU(conv3x3 with bias)``, which
``deploy=True`` builds directly. With ``se=True`` every form ends in a squeeze-and-excitation
block on that output (:class:`PostSE`, RepOpt-VGG-L2‡), which is not linear: the fold keeps it
as it is. State-dict names are the official ones (``conv``, ``bn``,
``conv_1x1``, ``scale_{conv,1x1,identity}.weight``; RepVGG's ``rbr_*``), so released checkpoints
and scale files load.
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ...errors import CheckpointError, ConfigError
from ...fold import FoldPolicy, Reparameterizable
from ...fold.arithmetic import affine_after_conv, batchnorm_affine, norm_fold_problems
from ...registry import MODELS


def centre_tap(kernel_1x1: torch.Tensor) -> torch.Tensor:
    """A (C_out, C_in, 1, 1) kernel as the centre tap of a 3x3 one."""
    return F.pad(kernel_1x1, [1, 1, 1, 1])


def identity_kernel(channels: int, like: torch.Tensor) -> torch.Tensor:
    """The 3x3 kernel of ``x -> x``: 1 at the centre tap of the diagonal (0-based (1, 1))."""
    kernel = like.new_zeros(channels, channels, 3, 3)
    kernel[torch.arange(channels), torch.arange(channels), 1, 1] = 1
    return kernel


def hyper_search_init(depth: int) -> float:
    """Initial s = t of a layer in Hyper-Search: ``sqrt(2 / depth)``, where ``depth`` counts
    the layers with an identity branch in the layer's stage up to and including it (1 for the
    first one, 2 for the next, ...); 1 for a layer without identity branch (``depth=0``: the
    stem and the stride-2 first layer of each stage). So in a standard stage of n layers:
    1, sqrt(2), 1, sqrt(2/3), ... This is the paper's appendix on initialization and its
    released code; its main text numbers the stride-2 layer as depth 1 instead, which the
    released code does not do. The identity scale starts at 1."""
    if depth < 0:
        raise ValueError(f'depth must be >= 0, got {depth}')
    return 1.0 if depth == 0 else math.sqrt(2.0 / depth)


class ChannelScale(nn.Module):
    """``x * weight`` per channel of (B, C, H, W); ``weight`` (C, ) is a parameter (named as
    the official scale layers, so Hyper-Search checkpoints keep their keys)."""

    def __init__(self, channels: int, value: float = 1.0, trainable: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), float(value)), requires_grad=trainable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.view(1, -1, 1, 1)


# SE width: channels // 4, as the released RepOptimizers code (SENet's own default is // 16)
SE_REDUCTION = 4


class PostSE(nn.Module):
    """Squeeze-and-excitation after a layer's ReLU: ``x * sigmoid(up(relu(down(mean_hw(x)))))``,
    ``down`` (C -> C // 4) and ``up`` (back to C) 1x1 convs with bias and torch's default init.

    RepOpt-VGG-L2‡ "insert[s] SE Blocks after each 3x3 conv" (the RepOptimizers paper's §4.1,
    Table 3); the released code puts the block on the layer's output after the ReLU, in all
    three forms (not before it, as RepVGG's own SE variant does), and so does this one.

    A local block, not an ecosystem one, because the backbone must build from the mmdet, mmseg
    and mmpretrain scopes alike while mmrepa requires only mmcv, which has no SE block. The
    others are optional and differ from the released block: mmpretrain's and mmdet's
    ``SELayer`` re-initialize their ConvModules (Kaiming-normal, zero bias; mmpretrain also
    rounds the width to a multiple of 8, as timm's ``SEModule`` does); torchvision's
    ``SqueezeExcitation`` matches it but torchvision is no dependency of mmrepa. The fold
    needs nothing of it (it has no fold method, so the walk leaves it alone). The released
    names ``post_se.down`` / ``post_se.up`` load as they are.
    """

    def __init__(self, channels: int):
        super().__init__()
        squeezed = max(channels // SE_REDUCTION, 1)
        self.down = nn.Conv2d(channels, squeezed, 1, bias=True)
        self.up = nn.Conv2d(squeezed, channels, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.up(F.relu(self.down(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(weight)


class _RepOptLayer(Reparameterizable, BaseModule):
    """What the three forms share: sizes, the deployed form and the fold into it.

    Subclasses build their training form unless ``deploy`` and implement :meth:`_fused`.
    ``se``: a :class:`PostSE` on the output (``post_se``), the same in every form, kept by the
    fold.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        se: bool = False,
    ):
        super().__init__(init_cfg=init_cfg)
        if stride not in (1, 2):
            raise ConfigError(f'stride must be 1 or 2, got {stride}')
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        # the identity branch exists only where x -> x has the output's shape
        self.has_identity = in_channels == out_channels and stride == 1
        self.deploy = deploy
        self.act = nn.ReLU()
        self.post_se = PostSE(out_channels) if se else None
        if deploy:
            self.conv = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=True)

    def conv3x3(self, bias: bool = False) -> nn.Conv2d:
        return nn.Conv2d(self.in_channels, self.out_channels, 3, self.stride, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deploy:
            return self.excite(self.act(self.conv(x)))
        return self.excite(self.act(self._forward_training(x)))

    def excite(self, y: torch.Tensor) -> torch.Tensor:
        """The SE block on the layer's output after the ReLU, if there is one."""
        return y if self.post_se is None else self.post_se(y)

    def _forward_training(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _fused(self, dtype: torch.dtype):
        """(kernel, bias) of the whole layer before the ReLU, in eval mode, in ``dtype``."""
        raise NotImplementedError

    def fold_problems(self) -> List[str]:
        """Every BatchNorm the fold reads must have finite running statistics."""
        return [
            problem
            for name, bn in self.named_modules()
            if isinstance(bn, _BatchNorm)
            for problem in norm_fold_problems(bn, name)
        ]

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """One 3x3 conv with bias (eval-mode BN)."""
        kernel, bias = self._fused(dtype)
        return {'conv.weight': kernel, 'conv.bias': bias}

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        like = next(self.parameters())
        for name in list(self._modules):
            if name not in ('act', 'post_se'):  # SE is not linear: it stays as it is
                delattr(self, name)
        for name in list(self._buffers):
            delattr(self, name)
        self.conv = self.conv3x3(bias=True).to(device=like.device, dtype=like.dtype)


@MODELS.register_module()
class RepOptConvBN(_RepOptLayer):
    """The plain layer a RepOptimizer trains: ``ReLU(BN(conv3x3(x; W)))``, no conv bias.

    Buffers ``scale_conv``, ``scale_1x1``, ``scale_identity`` (C_out, ) hold the Hyper-Search
    constants s, t, i (saved with the model, so a checkpoint alone rebuilds the multipliers and
    resume is exact). Until :meth:`set_scales` or a state dict with them sets them, s = t =
    ``init_scale`` and i = 1: the initial values of the Hyper-Search model.
    :meth:`repopt_branch_scales` gives the optimizer, for ``conv.weight``, the constant of each
    emulated branch at every kernel entry; the SGD multiplier is their sum of squares: s²
    off-centre, s² + t² at the centre, + 1 on the centre diagonal where the layer has an
    identity branch (the identity's constant is 1, not i²).

    A kernel loaded from a state dict without the constants (an official target checkpoint)
    while the constants are still the initial ones was trained with constants this layer does
    not know: :meth:`repopt_branch_scales` (i.e. training it with a RepOpt optimizer) refuses
    it until :meth:`set_scales` gives them. Inference does not need them.

    Args:
        in_channels, out_channels (int): Channels. stride (int): 1 or 2 (padding 1).
        deploy (bool): Build the folded layer (conv with bias, ReLU). Default: False.
        init_scale (float): Initial s = t (:func:`hyper_search_init`). Default: 1.0.
        se (bool): A :class:`PostSE` after the ReLU (no multiplier: not a branch). Default:
            False.

    Shapes: (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride)).
    """

    fold_state_keys = ('conv.bias', 'bn.running_mean')  # see mmrepa.fold.check_fold_state

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        init_scale: float = 1.0,
        se: bool = False,
    ):
        super().__init__(in_channels, out_channels, stride, deploy, init_cfg, se)
        # True once the constants come from set_scales or a state dict; True on a kernel
        # loaded without them while they were still the initial ones
        self.constants_given, self.kernel_without_constants = False, False
        if deploy:
            return
        self.conv = self.conv3x3()
        self.bn = nn.BatchNorm2d(out_channels)
        self.register_buffer('scale_conv', torch.full((out_channels,), float(init_scale)))
        self.register_buffer('scale_1x1', torch.full((out_channels,), float(init_scale)))
        self.register_buffer('scale_identity', torch.ones(out_channels))

    def _forward_training(self, x):
        return self.bn(self.conv(x))

    @torch.no_grad()
    def set_scales(
        self, s: torch.Tensor, t: torch.Tensor, i: Optional[torch.Tensor] = None
    ) -> None:
        """Set the constants (vectors of C_out; ``i`` only where there is an identity)."""
        self.scale_conv.copy_(s)
        self.scale_1x1.copy_(t)
        if i is not None:
            self.scale_identity.copy_(i)
        self.constants_given, self.kernel_without_constants = True, False

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if not self.deploy and prefix + 'conv.weight' in state_dict:
            if prefix + 'scale_conv' in state_dict:
                self.constants_given, self.kernel_without_constants = True, False
            elif not getattr(self, 'constants_given', False):
                self.kernel_without_constants = True
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def repopt_branch_scales(self) -> Dict[nn.Parameter, torch.Tensor]:
        """``{conv.weight: A}``, A (K, C_out, C_in, 3, 3) float32: the constant of branch k
        (3x3, 1x1, identity if present) at each kernel entry, 0 where k does not reach."""
        if self.deploy:
            return {}
        if getattr(self, 'kernel_without_constants', False):
            raise CheckpointError(
                'a RepOpt-VGG kernel was loaded from a checkpoint without its constants '
                '(scale_conv, scale_1x1, scale_identity) and none were given, so its '
                'multipliers would be the Hyper-Search initial values, not those it was '
                'trained with: set model.backbone.scales to the scales file it was trained '
                'with'
            )
        weight = self.conv.weight
        ones = torch.ones(weight.shape, dtype=torch.float32, device=weight.device)
        branches = [
            self.scale_conv.float().view(-1, 1, 1, 1) * ones,
            centre_tap(self.scale_1x1.float().view(-1, 1, 1, 1) * ones[..., 1:2, 1:2]),
        ]
        if self.has_identity:
            branches.append(identity_kernel(self.out_channels, ones))
        return {weight: torch.stack(branches)}

    @torch.no_grad()
    def reinitialize_(
        self,
        kernel_init: str = 'torch',
        identity_init: str = 'searched',
        generator: Optional[torch.Generator] = None,
    ) -> None:
        """The rule of initialization (the RepOptimizers paper's §3.4, Eq. 4):
        ``W = s ⊙ K0 + centre(t ⊙ P0) + diag_centre(i0)`` with fresh random K0, P0
        (``kernel_init``: ``'torch'``, PyTorch's Conv2d default as the released models;
        ``'msra'``, the paper's), ``i0`` the searched identity scale or 1 (``identity_init``:
        ``'searched'`` | ``'one'``); BN reset. From scratch only: never over loaded weights."""
        weight = self.conv.weight
        k0 = _random_kernel(weight.shape, kernel_init, generator).to(weight)
        p0 = _random_kernel((*weight.shape[:2], 1, 1), kernel_init, generator).to(weight)
        kernel = self.scale_conv.view(-1, 1, 1, 1) * k0 + centre_tap(
            self.scale_1x1.view(-1, 1, 1, 1) * p0
        )
        if self.has_identity:
            if identity_init not in ('searched', 'one'):
                raise ValueError(
                    f"identity_init must be 'searched' or 'one', got {identity_init!r}"
                )
            i0 = (
                self.scale_identity
                if identity_init == 'searched'
                else torch.ones_like(self.scale_identity)
            )
            kernel = kernel + identity_kernel(self.out_channels, weight) * i0.view(-1, 1, 1, 1)
        weight.copy_(kernel)
        self.bn.reset_parameters()

    def _fused(self, dtype):
        return affine_after_conv(self.conv, *batchnorm_affine(self.bn, dtype), dtype)


def _random_kernel(shape, kernel_init: str, generator) -> torch.Tensor:
    fan_in = shape[1] * shape[2] * shape[3]
    if kernel_init == 'torch':  # kaiming_uniform(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(shape, generator=generator) * 2 - 1) * bound
    if kernel_init == 'msra':  # kaiming_normal, fan_out, ReLU gain
        return torch.randn(shape, generator=generator) * math.sqrt(
            2.0 / (shape[0] * shape[2] * shape[3])
        )
    raise ValueError(f"kernel_init must be 'torch' or 'msra', got {kernel_init!r}")


@MODELS.register_module()
class CSLAConvBN(_RepOptLayer):
    """``ReLU(BN(s ⊙ conv3x3(x; K) + t ⊙ conv1x1(x; P) + i ⊙ x))``, one BN after the sum.

    The 1x1 conv has the layer's stride and no padding, so its taps meet the 3x3 centre for
    odd and even sizes alike; ``i ⊙ x`` only where in = out channels and stride 1.

    Args:
        in_channels, out_channels (int), stride (int): As :class:`RepOptConvBN`.
        init_scale (float): Initial s = t (:func:`hyper_search_init`); i starts at 1.
        trainable_scales (bool): True: Hyper-Search, s, t and i are learned. False: the CSLA
            block a RepOptimizer emulates, s and t constant (i is trained). Default: True.
        deploy (bool): Build the folded layer. Default: False.
        se (bool): A :class:`PostSE` after the ReLU. Default: False.
    """

    fold_state_keys = ('conv.bias', 'bn.running_mean')

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        init_scale: float = 1.0,
        trainable_scales: bool = True,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        se: bool = False,
    ):
        super().__init__(in_channels, out_channels, stride, deploy, init_cfg, se)
        if deploy:
            return
        self.conv = self.conv3x3()
        self.conv_1x1 = nn.Conv2d(in_channels, out_channels, 1, stride, 0, bias=False)
        self.scale_conv = ChannelScale(out_channels, init_scale, trainable_scales)
        self.scale_1x1 = ChannelScale(out_channels, init_scale, trainable_scales)
        if self.has_identity:
            self.scale_identity = ChannelScale(out_channels, 1.0)
        self.bn = nn.BatchNorm2d(out_channels)

    def _forward_training(self, x):
        y = self.scale_conv(self.conv(x)) + self.scale_1x1(self.conv_1x1(x))
        if self.has_identity:
            y = y + self.scale_identity(x)
        return self.bn(y)

    def equivalent_kernel(self) -> torch.Tensor:
        """The 3x3 kernel W' of the branch sum (differentiable in K, P, s, t, i)."""
        kernel = self.scale_conv.weight.view(-1, 1, 1, 1) * self.conv.weight + centre_tap(
            self.scale_1x1.weight.view(-1, 1, 1, 1) * self.conv_1x1.weight
        )
        if self.has_identity:
            kernel = kernel + identity_kernel(
                self.out_channels, kernel
            ) * self.scale_identity.weight.view(-1, 1, 1, 1)
        return kernel

    def scales(self) -> Dict[str, torch.Tensor]:
        """The searched constants in the official file's names (without the layer prefix)."""
        out = {
            'scale_conv.weight': self.scale_conv.weight,
            'scale_1x1.weight': self.scale_1x1.weight,
        }
        if self.has_identity:
            out['scale_identity.weight'] = self.scale_identity.weight
        return {k: v.detach().clone() for k, v in out.items()}

    def _fused(self, dtype):
        kernel = self.equivalent_kernel().detach()
        return affine_after_conv(kernel, *batchnorm_affine(self.bn, dtype), dtype)


@MODELS.register_module()
class RepVGGConvBN(_RepOptLayer):
    """RepVGG's training block, the structure RepOptimizers replace: ``ReLU(BN(conv3x3(x)) +
    BN(conv1x1(x)) + BN(x))`` (the identity BN only where in = out channels and stride 1).
    Official names: ``rbr_dense.{conv,bn}``, ``rbr_1x1.{conv,bn}``, ``rbr_identity``; ``se``
    as :class:`RepOptConvBN`."""

    fold_state_keys = ('conv.bias', 'rbr_dense.conv.weight')

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int = 1,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        se: bool = False,
    ):
        super().__init__(in_channels, out_channels, stride, deploy, init_cfg, se)
        # the identity BN's scale, kept apart by FoldPolicy(identity_apart=True)
        self.register_buffer('identity_scale', None)
        if deploy:
            return
        self.rbr_dense = nn.Sequential()
        self.rbr_dense.add_module('conv', self.conv3x3())
        self.rbr_dense.add_module('bn', nn.BatchNorm2d(out_channels))
        self.rbr_1x1 = nn.Sequential()
        self.rbr_1x1.add_module(
            'conv', nn.Conv2d(in_channels, out_channels, 1, stride, 0, bias=False)
        )
        self.rbr_1x1.add_module('bn', nn.BatchNorm2d(out_channels))
        self.rbr_identity = nn.BatchNorm2d(out_channels) if self.has_identity else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deploy and self.identity_scale is not None:
            return self.excite(self.act(self.conv(x) + x * self.identity_scale))
        return super().forward(x)

    def _forward_training(self, x):
        y = self.rbr_dense(x) + self.rbr_1x1(x)
        return y if self.rbr_identity is None else y + self.rbr_identity(x)

    def _fused(self, dtype, identity: bool = True):
        def conv_bn(conv, bn):
            return affine_after_conv(conv, *batchnorm_affine(bn, dtype), dtype)

        kernel, bias = conv_bn(self.rbr_dense.conv, self.rbr_dense.bn)
        k1, b1 = conv_bn(self.rbr_1x1.conv, self.rbr_1x1.bn)
        kernel, bias = kernel + centre_tap(k1), bias + b1
        if identity and self.rbr_identity is not None:
            ki, bi = conv_bn(identity_kernel(self.out_channels, kernel), self.rbr_identity)
            kernel, bias = kernel + ki, bias + bi
        return kernel, bias

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> dict:
        """``policy.identity_apart``: ``act(conv(x) + x * s)``, the identity BN's scale ``s``
        apart and its shift in the bias."""
        if not (policy.identity_apart and self.rbr_identity is not None):
            return super()._fold_tensors(dtype, policy)
        kernel, bias = self._fused(dtype, identity=False)
        scale, shift = batchnorm_affine(self.rbr_identity, dtype)
        return {
            'conv.weight': kernel,
            'conv.bias': bias + shift,
            'identity_scale': scale.view(1, -1, 1, 1),
        }

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        super()._apply_fold(tensors, policy)  # drops every buffer
        scale = tensors.get('identity_scale')
        self.register_buffer('identity_scale', None if scale is None else torch.empty_like(scale))
