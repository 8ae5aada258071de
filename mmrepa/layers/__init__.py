from .channel_idle_ffn import ChannelIdleFFN, channels_last_norm, num_active_channels
from .linear_attention import SimplifiedLinearAttention
from .patch_layers import FoldablePatchEmbed, FoldablePatchMerging
from .prepbn import PRepBN, RepBN
from .window_attention import (ShiftWindowMSA, WindowMSA, shifted_window_mask, window_partition,
                               window_reverse)

__all__ = [
    'ChannelIdleFFN', 'channels_last_norm', 'num_active_channels', 'SimplifiedLinearAttention',
    'FoldablePatchEmbed', 'FoldablePatchMerging', 'PRepBN', 'RepBN', 'ShiftWindowMSA',
    'WindowMSA', 'shifted_window_mask', 'window_partition', 'window_reverse'
]
