from .depth_rep_vit import DepthRepViT
from .metaformer import (
    CAFormer,
    ConvFormer,
    IdentityFormer,
    PoolFormer,
    PoolFormerV2,
    RandFormer,
)
from .mlp_mixer import MLPMixer
from .prepbn_pvt import PRepBNPVT
from .prepbn_vit import PRepBNViT
from .repa_vit import RePaViT
from .repopt_vgg import RepOptVGG
from .swin import PRepBNSwin, RePaSwin

__all__ = [
    'RePaSwin',
    'ConvFormer',
    'CAFormer',
    'PRepBNSwin',
    'RepOptVGG',
    'DepthRepViT',
    'RePaViT',
    'PRepBNViT',
    'MLPMixer',
    'PRepBNPVT',
    'PoolFormer',
    'PoolFormerV2',
    'IdentityFormer',
    'RandFormer',
]
