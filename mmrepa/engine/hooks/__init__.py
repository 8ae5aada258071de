from .reparameterize_hook import ReparameterizeHook

__all__ = ['ReparameterizeHook']
