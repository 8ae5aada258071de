from .depth_rep_vit import DepthRepViT
from .metaformer import (
    CAFormer,
    ConvFormer,
    IdentityFormer,
    PoolFormer,
    PoolFormerV2,
    RandFormer,
)
from .prepbn_swin import PRepBNSwin
from .repa_swin import RePaSwin
from .repopt_vgg import RepOptVGG

__all__ = [
    'RePaSwin',
    'ConvFormer',
    'CAFormer',
    'PoolFormer',
    'PoolFormerV2',
    'IdentityFormer',
    'RandFormer',
    'PRepBNSwin',
    'RepOptVGG',
    'DepthRepViT',
]
