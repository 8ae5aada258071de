from .prepbn_swin import PRepBNSwin
from .repa_swin import RePaSwin

__all__ = ['PRepBNSwin', 'RePaSwin']
