from .metaformer import CAFormer, ConvFormer
from .repa_swin import RePaSwin

__all__ = ['RePaSwin', 'ConvFormer', 'CAFormer']
