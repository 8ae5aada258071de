from .channel_idle_ffn import ChannelIdleFFN, channels_last_norm, num_active_channels
from .window_attention import (ShiftWindowMSA, WindowMSA, shifted_window_mask, window_partition,
                               window_reverse)

__all__ = [
    'ChannelIdleFFN', 'channels_last_norm', 'num_active_channels', 'ShiftWindowMSA', 'WindowMSA',
    'shifted_window_mask', 'window_partition', 'window_reverse'
]
