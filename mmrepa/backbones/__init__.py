from .repa_swin import RePaSwin

__all__ = ['RePaSwin']
