"""ViTDet's simple feature pyramid: a multi-scale neck built from a single stride-16 map.

Li et al. 2022, "Exploring Plain Vision Transformer Backbones for Object Detection", §3: a plain
(non-hierarchical) backbone gives one map; deconvolutions and a max-pool make the other scales
from it, with no top-down or lateral fusion between levels.
"""

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmengine.model import BaseModule
from mmengine.registry import MODELS

from ..errors import ConfigError, ConfigTypeError
from ..options import is_int_at_least
from ..registry import build_norm_layer, resolve_layer_type

# Scale factors a level can have (relative to the input map) and the channel divisor of each.
_CHANNEL_DIVISORS = {4.0: 4, 2.0: 2, 1.0: 1, 0.5: 1}


@MODELS.register_module()
class SimpleFPN(BaseModule):
    """ViTDet's simple feature pyramid, a neck for mmdet detectors and mmseg decoders.

    It takes the LAST map of the backbone's outputs (stride 16, ``in_channels`` = C channels)
    and rescales it once per scale factor::

        4.0: ConvTranspose2d(C, C/2, 2, stride 2) -> norm -> GELU
             -> ConvTranspose2d(C/2, C/4, 2, stride 2)                     stride 4,  C/4
        2.0: ConvTranspose2d(C, C/2, 2, stride 2)                          stride 8,  C/2
        1.0: identity                                                      stride 16, C
        0.5: MaxPool2d(2, stride 2)                                        stride 32, C

    then each level goes through a 1x1 conv and a 3x3 conv (padding 1) to ``out_channels``, each
    conv without bias and followed by ``norm_cfg`` (and ``act_cfg`` if given). Levels beyond the
    scale factors (``num_outs > len(scale_factors)``) are ``max_pool2d(kernel 1, stride 2)`` of
    the previous output, as mmdet's ``FPN`` with ``add_extra_convs=False``.

    Shapes: input (B, C, h, w) (a tensor, or a tuple/list whose last element is used) ->
    a tuple of ``num_outs`` maps (B, out_channels, h_i, w_i). With the default options that is
    strides 4, 8, 16, 32, 64 and sizes ``4h, 2h, h, floor(h / 2), ceil(floor(h / 2) / 2)``
    (likewise for w): the max-pool drops an odd last row/column, the stride-2 1x1 pool keeps
    it. For example 13x21 tokens give 52x84, 26x42, 13x21, 6x10 and 3x5.

    Args:
        in_channels (int): Channels C of the backbone's last map (the ViT's embedding width).
        out_channels (int): Channels of every output level. Default: 256.
        num_outs (int): Output levels, at least ``len(scale_factors)``. Default: 5.
        scale_factors (Sequence[float]): The levels made from the input map, finest first; a
            subset of (4.0, 2.0, 1.0, 0.5) in that order. C must be divisible by 4 if 4.0 is in
            it and by 2 if 2.0 is. Default: (4.0, 2.0, 1.0, 0.5).
        norm_cfg (dict, optional): Norm after each conv and between the two deconvolutions of
            the 4x level; ``None`` for no norm (the convs then have biases). An mmrepa norm
            (``'LN2d'``, ``'mmrepa.LN2d'``) or any of mmcv's. Default: ``dict(type='LN2d',
            eps=1e-6)``, a LayerNorm over channels (:class:`mmrepa.layers.LayerNorm2d`).
        act_cfg (dict, optional): Activation after each 1x1 and 3x3 conv; ViTDet has none.
            Default: None.
        init_cfg (dict | list[dict], optional): Initialization config. The convs are
            Kaiming-initialized by ``ConvModule`` already.

    Example: a ViT-B (C = 768) in an mmdet config, after ``custom_imports=dict(imports=
    ['mmrepa'])``: ``neck=dict(type='SimpleFPN', in_channels=768, out_channels=256,
    num_outs=5)`` with anchor or prior strides (4, 8, 16, 32, 64).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int = 256,
        num_outs: int = 5,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        norm_cfg: Optional[dict] = dict(type='LN2d', eps=1e-6),
        act_cfg: Optional[dict] = None,
        init_cfg: Optional[Union[dict, List[dict]]] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        if not is_int_at_least(in_channels, 1):
            raise ConfigTypeError(
                f'SimpleFPN in_channels must be a positive int, the channels '
                f"of the backbone's last map, got {in_channels!r}"
            )
        scale_factors = self._check_scale_factors(scale_factors)
        for factor in scale_factors:
            divisor = _CHANNEL_DIVISORS[factor]
            if in_channels % divisor:
                raise ConfigError(
                    f'SimpleFPN: scale factor {factor:g} makes a level of in_channels / '
                    f'{divisor} channels, but in_channels={in_channels} is not divisible by '
                    f'{divisor}; change in_channels or drop {factor:g} from scale_factors'
                )
        if num_outs < len(scale_factors):
            raise ConfigError(
                f'SimpleFPN num_outs={num_outs} is smaller than the '
                f'{len(scale_factors)} levels of scale_factors={scale_factors}; '
                f'set num_outs >= {len(scale_factors)} or use fewer scale factors'
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_outs = num_outs
        self.scale_factors = scale_factors

        # mmcv's ConvModule looks norms up in mmcv's registry only: hand it mmrepa's class.
        conv_norm_cfg = None if norm_cfg is None else resolve_layer_type(norm_cfg)
        self.stages = nn.ModuleList()
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for factor in scale_factors:
            stage = self._make_stage(factor, in_channels, norm_cfg)
            self.stages.append(stage)
            level_channels = in_channels // _CHANNEL_DIVISORS[factor]
            self.lateral_convs.append(
                ConvModule(level_channels, out_channels, 1, norm_cfg=conv_norm_cfg, act_cfg=act_cfg)
            )
            self.fpn_convs.append(
                ConvModule(
                    out_channels,
                    out_channels,
                    3,
                    padding=1,
                    norm_cfg=conv_norm_cfg,
                    act_cfg=act_cfg,
                )
            )

    @staticmethod
    def _check_scale_factors(scale_factors: Sequence[float]) -> Tuple[float, ...]:
        allowed = tuple(_CHANNEL_DIVISORS)
        if isinstance(scale_factors, (int, float)) or not len(scale_factors):
            raise ConfigError(
                f'SimpleFPN scale_factors must be a non-empty sequence from '
                f'{allowed}, got {scale_factors!r}'
            )
        bad = [f for f in scale_factors if not isinstance(f, (int, float)) or f not in allowed]
        if bad:
            raise ConfigError(
                f'SimpleFPN scale_factors {tuple(scale_factors)}: {bad} not '
                f'supported; each must be one of {allowed}'
            )
        factors = tuple(float(f) for f in scale_factors)
        # Detectors pair output i with the i-th anchor/prior stride: finest level first.
        if any(a <= b for a, b in zip(factors, factors[1:])):
            raise ConfigError(
                f'SimpleFPN scale_factors {factors} must be distinct and in '
                f'decreasing order (finest level first), e.g. {allowed}'
            )
        return factors

    @staticmethod
    def _make_stage(factor: float, channels: int, norm_cfg: Optional[dict]) -> nn.Module:
        """The rescaling of one level: (B, C, h, w) -> (B, C / divisor, factor*h, factor*w)."""
        if factor == 4.0:
            layers = [nn.ConvTranspose2d(channels, channels // 2, 2, stride=2)]
            if norm_cfg is not None:
                layers.append(build_norm_layer(norm_cfg, channels // 2)[1])
            layers += [nn.GELU(), nn.ConvTranspose2d(channels // 2, channels // 4, 2, stride=2)]
            return nn.Sequential(*layers)
        if factor == 2.0:
            return nn.ConvTranspose2d(channels, channels // 2, 2, stride=2)
        if factor == 1.0:
            return nn.Identity()
        return nn.MaxPool2d(2, stride=2)

    def forward(
        self, inputs: Union[torch.Tensor, Sequence[torch.Tensor]]
    ) -> Tuple[torch.Tensor, ...]:
        """``inputs``: the backbone's outputs (or one map); returns ``num_outs`` maps."""
        if isinstance(inputs, torch.Tensor):
            x = inputs
        elif isinstance(inputs, (tuple, list)) and len(inputs):
            x = inputs[-1]
        else:
            raise TypeError(
                f'SimpleFPN takes a tensor or a non-empty tuple/list of tensors '
                f'(the backbone outputs), got {type(inputs).__name__}'
                + (' (empty)' if isinstance(inputs, (tuple, list)) else '')
            )
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f'SimpleFPN expected the last backbone output as (B, {self.in_channels}, H, W) '
                f"(in_channels={self.in_channels}), got shape {tuple(x.shape)}; set the neck's "
                f"in_channels to the channels of the backbone's last output"
            )
        outs = [
            fpn(lateral(stage(x)))
            for stage, lateral, fpn in zip(self.stages, self.lateral_convs, self.fpn_convs)
        ]
        for _ in range(self.num_outs - len(outs)):
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
