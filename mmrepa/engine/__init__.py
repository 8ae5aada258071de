from .hooks import ReparameterizeHook

__all__ = ['ReparameterizeHook']
