"""The MetaFormer family (ConvFormer, CAFormer, PoolFormer v1 / v2, IdentityFormer,
RandFormer) with the blocks only it uses: StarReLU, SepConv, pooling and random mixing,
ResScale and LayerScale."""

from .activations import SquaredReLU, StarReLU
from .arch import ARCH_SETTINGS, POOLFORMER_ARCHS, resolve_arch
from .backbone import (
    CAFormer,
    ConvFormer,
    IdentityFormer,
    MetaFormer,
    PoolFormer,
    PoolFormerV2,
    RandFormer,
)
from .blocks import MetaFormerBlock, MetaFormerStage, ffn_config
from .checkpoint import checkpoint_filter_fn
from .mixers import Pooling, RandomMixing
from .res_scale import LayerScale, ResScale
from .sep_conv import SepConv

__all__ = [
    'ARCH_SETTINGS',
    'POOLFORMER_ARCHS',
    'CAFormer',
    'ConvFormer',
    'IdentityFormer',
    'LayerScale',
    'MetaFormer',
    'MetaFormerBlock',
    'MetaFormerStage',
    'PoolFormer',
    'PoolFormerV2',
    'Pooling',
    'RandFormer',
    'RandomMixing',
    'ResScale',
    'SepConv',
    'SquaredReLU',
    'StarReLU',
    'checkpoint_filter_fn',
    'ffn_config',
    'resolve_arch',
]
