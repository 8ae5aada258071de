from .depth_rep_vit import DepthRepViT
from .metaformer import CAFormer, ConvFormer
from .mlp_mixer import MLPMixer
from .prepbn_swin import PRepBNSwin
from .repa_swin import RePaSwin
from .repopt_vgg import RepOptVGG

__all__ = [
    'RePaSwin',
    'ConvFormer',
    'CAFormer',
    'PRepBNSwin',
    'RepOptVGG',
    'DepthRepViT',
    'MLPMixer',
]
