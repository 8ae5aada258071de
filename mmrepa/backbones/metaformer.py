"""ConvFormer and CAFormer (MetaFormer baselines), with optional channel-idle (RePa) MLPs.

With ``idle_ratio=0`` these are the published models (SPEC §3) and load timm's and the original
release's ImageNet checkpoints; with ``idle_ratio > 0`` the MLPs are RePaFormer's channel-idle
FFNs (BatchNorm pre-norm and hidden norm, StarReLU on the first ``ceil(4C(1 - idle_ratio))``
hidden channels), which fold into three matrices at test time (SPEC §1).

Everything runs channels-last, (B, H, W, C), as the original release does; the outputs are NCHW.
"""

import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmengine.model import BaseModule, ModuleList
from mmengine.registry import MODELS

from ..checkpoint.loading import strip_prefixes
from ..errors import ConfigError, ConfigTypeError
from ..fold import FoldPolicy, Reparameterizable, norm_fold_problems
from ..layers import (
    ChannelIdleFFN,
    ResScale,
    SepConv,
    WindowedSelfAttention,
    activate_first_,
    channels_last_norm,
    checkpoint_forward,
    num_active_channels,
)
from ..options import is_int_at_least, per_stage, per_stage_ratios
from ..registry import build_activation_layer, build_norm_layer
from .base import DenseBackbone, drop_path_rates, lookup_arch, trunc_normal_init_

# depths and dims of the published variants (the paper's Table II; timm's metaformer.py).
ARCH_SETTINGS: Dict[str, dict] = {
    's18': dict(depths=(3, 3, 9, 3), dims=(64, 128, 320, 512)),
    's36': dict(depths=(3, 12, 18, 3), dims=(64, 128, 320, 512)),
    'm36': dict(depths=(3, 12, 18, 3), dims=(96, 192, 384, 576)),
    'b36': dict(depths=(3, 12, 18, 3), dims=(128, 256, 512, 768)),
}
NUM_STAGES = 4
RES_SCALE_STAGES = (2, 3)  # ResScale on both shortcuts of stages 3 and 4 only
MLP_RATIO = 4
# LayerNorm without bias, as in the blocks, the stem and the downsampling layers.
LN_NO_BIAS = dict(type='LN', eps=1e-6, bias=False)


def resolve_arch(arch: Union[str, dict]) -> dict:
    """``'s18' | 's36' | 'm36' | 'b36'`` or ``dict(depths=..., dims=...)`` -> arch settings."""
    arch = lookup_arch(arch, ARCH_SETTINGS, ('depths', 'dims'))
    if (
        set(arch) != {'depths', 'dims'}
        or len(arch['depths']) != NUM_STAGES
        or len(arch['dims']) != NUM_STAGES
    ):
        raise ConfigError(
            f'a custom arch needs {NUM_STAGES} depths and {NUM_STAGES} dims (one '
            f'per stage) and no other key, got {arch}'
        )
    return dict(depths=tuple(arch['depths']), dims=tuple(arch['dims']))


def _layer_norm_no_bias(dims: int) -> nn.Module:
    return build_norm_layer(LN_NO_BIAS, dims)[1]


class Stem(nn.Module):
    """Conv k7 s4 p2 (with bias), then LayerNorm without bias: (B, C_in, H, W) -> (B, H', W', C)."""

    def __init__(self, in_channels: int, dims: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, dims, kernel_size=7, stride=4, padding=2)
        self.norm = _layer_norm_no_bias(dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x).permute(0, 2, 3, 1))


class Downsampling(nn.Module):
    """LayerNorm without bias, then conv k3 s2 p1 (with bias): (B, H, W, C) -> (B, H', W', C')."""

    def __init__(self, in_dims: int, out_dims: int):
        super().__init__()
        self.norm = _layer_norm_no_bias(in_dims)
        self.conv = nn.Conv2d(in_dims, out_dims, kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def ffn_config(dims: int, idle_ratio: float, res_scale: bool) -> dict:
    """The :class:`ChannelIdleFFN` equivalent to a block's MLP branch (norm2, mlp, res_scale2)."""
    repa = idle_ratio > 0
    return dict(
        embed_dims=dims,
        mlp_ratio=MLP_RATIO,
        idle_ratio=idle_ratio,
        norm_cfg=dict(type='BN1d') if repa else LN_NO_BIAS,
        hidden_norm_cfg=dict(type='BN1d') if repa else None,
        act_cfg=dict(type='StarReLU'),
        bias=False,
        res_scale=res_scale,
    )


class MetaFormerMlp(nn.Module):
    """fc1 -> StarReLU on the first ``active`` hidden channels -> [hidden BN] -> fc2, no biases.

    Channels-last: (..., C) -> (..., C). Names follow timm's ``Mlp`` (``fc1``, ``act``,
    ``norm``, ``fc2``).
    """

    def __init__(
        self, dims: int, hidden: int, active: int, act_cfg: dict, hidden_norm_cfg: Optional[dict]
    ):
        super().__init__()
        self.active = active
        self.fc1 = nn.Linear(dims, hidden, bias=False)
        self.act = build_activation_layer(act_cfg)
        self.norm = build_norm_layer(hidden_norm_cfg, hidden)[1] if hidden_norm_cfg else None
        self.fc2 = nn.Linear(hidden, dims, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # 2-D, so fc1's output is not a view
        h = activate_first_(self.act, self.fc1(tokens), self.active)
        if self.norm is not None:
            h = self.norm(h)
        return self.fc2(h).view(x.shape)


class MetaFormerBlock(Reparameterizable, BaseModule):
    """``x = r1 * x + mixer(norm1(x))``, then ``x = r2 * x + mlp(norm2(x))``; (B, H, W, C).

    ``r1``, ``r2`` (``res_scale1``, ``res_scale2``) exist only with ``res_scale=True``. The MLP
    branch (``norm2``, ``mlp``, ``res_scale2``) is a channel-idle FFN with timm's names; folding
    turns it into a folded :class:`ChannelIdleFFN` ``ffn`` (with ``idle_ratio=0`` its LayerNorm
    stays and only StarReLU's scale and bias move into ``fc2``).
    """

    fold_state_keys = ('ffn.in_proj.weight', 'mlp.fc1.weight')  # see check_fold_state

    def __init__(
        self,
        dims: int,
        token_mixer: nn.Module,
        idle_ratio: float,
        res_scale: bool,
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.with_cp = with_cp
        self.deploy = deploy
        ffn_cfg = ffn_config(dims, idle_ratio, res_scale)
        self.norm1 = _layer_norm_no_bias(dims)
        self.token_mixer = token_mixer
        self.res_scale1 = ResScale(dims) if res_scale else None
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        if deploy:
            self.ffn = ChannelIdleFFN(**ffn_cfg, deploy=True)
            return
        hidden = MLP_RATIO * dims
        self.norm2 = build_norm_layer(ffn_cfg['norm_cfg'], dims)[1]
        self.mlp = MetaFormerMlp(
            dims,
            hidden,
            num_active_channels(hidden, idle_ratio),
            ffn_cfg['act_cfg'],
            ffn_cfg['hidden_norm_cfg'],
        )
        self.res_scale2 = ResScale(dims) if res_scale else None

    @staticmethod
    def _residual(res_scale: Optional[ResScale], x: torch.Tensor, y: torch.Tensor):
        return x + y if res_scale is None else res_scale(x, y)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._residual(self.res_scale1, x, self.drop_path(self.token_mixer(self.norm1(x))))
        if self.deploy:
            return self.ffn(x)
        y = self.drop_path(self.mlp(channels_last_norm(self.norm2, x)))
        return self._residual(self.res_scale2, x, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x)
        return self._forward(x)

    def fold_problems(self) -> List[str]:
        """The norms the MLP branch's fold reads must have finite running statistics."""
        if self.deploy:
            return []
        return norm_fold_problems(self.norm2, 'norm2') + norm_fold_problems(
            self.mlp.norm, 'mlp.norm'
        )

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        """The MLP branch becomes a :class:`ChannelIdleFFN` made of its modules, folded."""
        ffn = ChannelIdleFFN.from_modules(
            self.norm2,
            self.mlp.fc1,
            self.mlp.act,
            self.mlp.fc2,
            self.mlp.active,
            hidden_norm=self.mlp.norm,
            res_scale=self.res_scale2.scale if self.res_scale2 is not None else None,
        )
        ffn.train(self.training).reparameterize(policy)
        del self.norm2, self.mlp, self.res_scale2
        self.ffn = ffn


class MetaFormerStage(BaseModule):
    """Optional :class:`Downsampling`, then the blocks; (B, H, W, C) in and out."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        downsample: Optional[nn.Module] = None,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        self.downsample = downsample
        self.blocks = ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        for block in self.blocks:
            x = block(x)
        return x


class MetaFormer(DenseBackbone):
    """Shared body of :class:`ConvFormer` and :class:`CAFormer`; see their docstrings.

    ``token_mixers`` gives each stage's mixer: ``'conv'`` (:class:`SepConv`) or ``'attn'``
    (:class:`WindowedSelfAttention`); ``window_sizes`` and ``global_blocks`` (per stage)
    configure the attention stages.
    """

    def __init__(
        self,
        arch: Union[str, dict],
        token_mixers: Sequence[str],
        in_channels: int = 3,
        idle_ratio: Union[float, Sequence[float]] = 0.0,
        window_sizes: Sequence[Optional[int]] = (None,) * NUM_STAGES,
        global_blocks: Sequence[Sequence[int]] = ((),) * NUM_STAGES,
        head_dim: int = 32,
        drop_path_rate: float = 0.0,
        out_norm_cfg: dict = dict(type='LN', eps=1e-6),
        out_indices: Sequence[int] = (0, 1, 2, 3),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch)
        depths, self.num_features = arch['depths'], list(arch['dims'])
        self.in_channels = in_channels
        self._check_options(NUM_STAGES, out_indices, frozen_stages, norm_eval, deploy)
        self.idle_ratios = per_stage_ratios(idle_ratio, NUM_STAGES, 'idle_ratio')

        self.stem = Stem(in_channels, self.num_features[0])
        dpr = drop_path_rates(drop_path_rate, sum(depths))
        self.stages = ModuleList()
        for i, depth in enumerate(depths):
            dims = self.num_features[i]
            blocks = []
            for j in range(depth):
                if token_mixers[i] == 'conv':
                    mixer = SepConv(dims, deploy=deploy)
                else:
                    window = None if j in global_blocks[i] else window_sizes[i]
                    mixer = WindowedSelfAttention(dims, head_dim=head_dim, window_size=window)
                blocks.append(
                    MetaFormerBlock(
                        dims,
                        mixer,
                        idle_ratio=self.idle_ratios[i],
                        res_scale=i in RES_SCALE_STAGES,
                        drop_path_rate=dpr[sum(depths[:i]) + j],
                        with_cp=with_cp,
                        deploy=deploy,
                    )
                )
            downsample = Downsampling(self.num_features[i - 1], dims) if i > 0 else None
            self.stages.append(MetaFormerStage(blocks, downsample))
        self._setup_outputs(out_norm_cfg)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W) -> per index in ``out_indices``: (B, C_i, H_i, W_i), with
        ``H_0 = floor((H - 3) / 4) + 1`` (the stem) and ``H_i = ceil(H_{i-1} / 2)``."""
        self._check_input(x, 3, 'the stem (kernel 7, padding 2) needs at least 3 x 3 pixels')
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(out.permute(0, 3, 1, 2).contiguous())
        return tuple(outs)

    def _default_init(self):
        """timm's initialisation."""
        trunc_normal_init_(self, (nn.Linear, nn.Conv2d))

    def filter_checkpoint(self, state_dict):
        """A timm, original-release or mmrepa state dict in our names; see
        :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


def _window_sizes(window_size, token_mixers) -> list:
    sizes = per_stage(window_size, NUM_STAGES, 'window_size')
    for i, (size, mixer) in enumerate(zip(sizes, token_mixers)):
        if mixer != 'attn':
            if isinstance(window_size, (list, tuple)) and size is not None:
                raise ConfigError(
                    f'window_size {tuple(window_size)}: stage {i + 1} has no '
                    f'attention (SepConv); give None there'
                )
            sizes[i] = None
        elif size is not None and not is_int_at_least(size, 1):
            raise ConfigError(
                f'window_size must be None (global attention) or an integer >= 1, '
                f'one value or one per stage; got {window_size!r}'
            )
    return sizes


def _global_blocks(global_blocks, depths, token_mixers) -> list:
    if global_blocks is None:
        return [()] * NUM_STAGES
    if not isinstance(global_blocks, (list, tuple)) or len(global_blocks) != NUM_STAGES:
        raise ConfigError(
            f'global_blocks must give a sequence of block indices for each of the '
            f'{NUM_STAGES} stages, e.g. ((), (), (8, ), ()), got {global_blocks!r}'
        )
    for i, indices in enumerate(global_blocks):
        indices = tuple(indices or ())
        if indices and token_mixers[i] != 'attn':
            raise ConfigError(
                f'global_blocks: stage {i + 1} has no attention (SepConv); give () there'
            )
        for j in indices:
            if not 0 <= j < depths[i]:
                raise ConfigError(
                    f'global_blocks: block {j} does not exist in stage {i + 1}, '
                    f'which has {depths[i]} blocks (indices 0..{depths[i] - 1})'
                )
    return [tuple(ix or ()) for ix in global_blocks]


@MODELS.register_module()
class ConvFormer(MetaFormer):
    """ConvFormer backbone (MetaFormer baselines): SepConv token mixers in all four stages.

    Outputs NCHW maps at strides 4, 8, 16, 32 for the stages in ``out_indices``, each through its
    own output norm ``norm{i}``; any input size of at least 3 x 3 works (strided convolutions
    round up). State-dict names follow timm's ``metaformer.py``.

    Args:
        arch (str | dict): ``'s18'``, ``'s36'``, ``'m36'``, ``'b36'``, or
            ``dict(depths=(...4), dims=(...4))``. Default: ``'s18'``.
        in_channels (int): Input image channels. Default: 3.
        idle_ratio (float | Sequence[float]): 0 for the published MLP (LayerNorm, StarReLU on
            all hidden channels); in (0, 1] for RePaFormer's channel-idle MLP (BatchNorm
            pre-norm and hidden norm, StarReLU on ``ceil(4C(1 - idle_ratio))`` channels).
            One value or one per stage. Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the blocks to this.
            Default: 0.
        out_norm_cfg (dict, optional): Norm of each output; None for none (the classifier's
            :class:`~mmrepa.heads.MetaFormerClsHead` normalises after pooling, as the paper).
            Default: ``dict(type='LN', eps=1e-6)``.
        out_indices (Sequence[int]): Stages whose outputs are returned. Default: (0, 1, 2, 3).
        frozen_stages (int): Freeze the stem (0) and stages 1..n (n >= 1), their downsampling
            and output norms: parameters fixed, eval mode. -1 freezes nothing. Default: -1.
        norm_eval (bool): Keep every BatchNorm in eval mode while training. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded structure directly (to load folded checkpoints).
            Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads timm,
            original-release and mmrepa checkpoints (see :func:`checkpoint_filter_fn`);
            otherwise timm's truncated-normal initialisation.
    """

    def __init__(self, arch: Union[str, dict] = 's18', **kwargs):
        attention_only = {'window_sizes', 'global_blocks', 'head_dim'} & set(kwargs)
        if attention_only:
            raise ConfigTypeError(
                f'ConvFormer has no attention, so no '
                f'{sorted(attention_only)}: use CAFormer for attention stages'
            )
        super().__init__(arch, ('conv',) * NUM_STAGES, **kwargs)


@MODELS.register_module()
class CAFormer(MetaFormer):
    """CAFormer backbone (MetaFormer baselines): SepConv in stages 1-2, attention in 3-4.

    Attention has head_dim 32 and no qkv/proj bias or positional parameters, so it can be
    windowed without touching the checkpoint: ``window_size`` limits it to non-overlapping
    windows (the map padded, padded keys masked) so detection at 800 x 1333 runs in bounded
    memory; ``global_blocks`` keeps a few blocks global. Every other argument is as in
    :class:`ConvFormer` and passed on.

    Args:
        window_size (int | None | Sequence[int | None]): Attention window side in tokens; one
            value for stages 3-4 or one per stage (``None`` at stages 1-2). ``None`` is global
            attention. Default: ``(None, None, 14, 7)``, the token grids of 224-pixel
            pretraining, so windows see what pretraining saw.
        global_blocks (Sequence[Sequence[int]], optional): Per stage, indices of blocks that
            attend globally whatever the window size, e.g. ``((), (), (8, ), ())``.
            Default: None (none).
        head_dim (int): Channels per attention head. Default: 32.
    """

    def __init__(
        self,
        arch: Union[str, dict] = 's18',
        window_size: Union[None, int, Sequence[Optional[int]]] = (None, None, 14, 7),
        global_blocks: Optional[Sequence[Sequence[int]]] = None,
        head_dim: int = 32,
        **kwargs,
    ):
        mixers = ('conv', 'conv', 'attn', 'attn')
        depths = resolve_arch(arch)['depths']
        super().__init__(
            arch,
            mixers,
            window_sizes=_window_sizes(window_size, mixers),
            global_blocks=_global_blocks(global_blocks, depths, mixers),
            head_dim=head_dim,
            **kwargs,
        )


_RELEASE_DOWNSAMPLE = re.compile(r'^downsample_layers\.(\d+)\.(pre_norm|post_norm|conv)\.')
_RELEASE_BLOCK = re.compile(r'^stages\.(\d+)\.(\d+)\.')


def _from_original_release(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """sail-sg/metaformer layout -> timm's names (``downsample_layers.0`` is the stem)."""
    out = {}
    for k, v in state_dict.items():
        m = _RELEASE_DOWNSAMPLE.match(k)
        if m:
            i, part = int(m.group(1)), 'conv' if m.group(2) == 'conv' else 'norm'
            k = (f'stem.{part}.' if i == 0 else f'stages.{i}.downsample.{part}.') + k[m.end() :]
        elif _RELEASE_BLOCK.match(k):
            k = _RELEASE_BLOCK.sub(r'stages.\1.blocks.\2.', k)
        elif k.startswith('norm.'):  # the classifier's norm; timm calls it head.norm
            k = 'head.' + k
        elif k.startswith('head.'):
            k = 'head.fc.' + k[len('head.') :]
        out[k] = v
    return out


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: MetaFormer) -> dict:
    """Convert a ConvFormer / CAFormer state dict to :class:`MetaFormer` names and shapes.

    Understands: timm's ``metaformer.py`` (``convformer_s18.sail_in1k`` etc.: same names; its
    1x1-conv pointwise weights become Linear weights); the original release
    (``downsample_layers.*``, ``stages.{i}.{j}.*``, ``norm``, ``head``); mmrepa's own (folded
    or not, matching ``deploy``), also inside a whole detector (``backbone.*``). The
    classifier's final norm becomes the last output norm; the classifier itself is not loaded
    (the loader lists it as unused).
    """
    state_dict = strip_prefixes(state_dict)
    if any(k.startswith('downsample_layers.') for k in state_dict):
        state_dict = _from_original_release(state_dict)
    last_norm = f'norm{model.num_stages - 1}'
    out = {}
    for k, v in state_dict.items():
        if k.startswith('head.norm.') and model.has_output_norm(model.num_stages - 1):
            k = last_norm + k[len('head.norm') :]
        out[k] = v  # the classifier (head.fc.*) is left in, to be reported as unused
    own = model.state_dict()
    for k, v in out.items():
        if k in own and v.dim() == 4 and own[k].dim() == 2 and v.shape[2:] == (1, 1):
            out[k] = v.flatten(1)  # timm's 1x1 conv (out, in, 1, 1) -> Linear (out, in)
    return out
