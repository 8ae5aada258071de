"""The Swin family: RePa-Swin (channel-idle FFNs) and PRepBN-Swin / SLAB-Swin (PRepBN norms,
optional linear attention), with the blocks only Swin uses: shifted-window attention and the
foldable patch merging."""

from .blocks import RePaSwinBlock, RePaSwinStage
from .checkpoint import checkpoint_filter_fn
from .patch_merging import FoldablePatchMerging
from .prepbn_swin import PRepBNSwin, prepbn_checkpoint_filter_fn
from .repa_swin import ARCH_SETTINGS, RePaSwin, resolve_arch
from .window_attention import ShiftWindowMSA, WindowMSA, shifted_window_mask, window_layout

__all__ = [
    'ARCH_SETTINGS',
    'FoldablePatchMerging',
    'PRepBNSwin',
    'RePaSwin',
    'RePaSwinBlock',
    'RePaSwinStage',
    'ShiftWindowMSA',
    'WindowMSA',
    'checkpoint_filter_fn',
    'prepbn_checkpoint_filter_fn',
    'resolve_arch',
    'shifted_window_mask',
    'window_layout',
]
