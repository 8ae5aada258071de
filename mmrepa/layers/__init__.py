from .channel_idle_ffn import (
    ChannelIdleFFN,
    activate_first_,
    channels_last_norm,
    num_active_channels,
)
from .grad_checkpoint import batchnorm_statistics_kept, checkpoint_forward
from .linear_attention import SimplifiedLinearAttention
from .mix_token import MixedTokens, TokenBox, draw_token_box, swap_token_box
from .norm2d import GroupNorm1, LayerNorm2d
from .output_affine import bare_activation, has_output_affine, output_affine
from .patch_layers import ConvPatchEmbed, FoldablePatchEmbed
from .prenorm_block import PreNormBlock
from .prepbn import PRepBN, RepBN, from_linear_norm
from .window_attention import attend_in_windows, window_partition, window_reverse
from .windowed_self_attention import WindowedSelfAttention

__all__ = [
    'batchnorm_statistics_kept',
    'checkpoint_forward',
    'ChannelIdleFFN',
    'activate_first_',
    'channels_last_norm',
    'num_active_channels',
    'attend_in_windows',
    'window_partition',
    'window_reverse',
    'bare_activation',
    'has_output_affine',
    'output_affine',
    'WindowedSelfAttention',
    'SimplifiedLinearAttention',
    'ConvPatchEmbed',
    'FoldablePatchEmbed',
    'PreNormBlock',
    'PRepBN',
    'RepBN',
    'from_linear_norm',
    'LayerNorm2d',
    'MixedTokens',
    'TokenBox',
    'draw_token_box',
    'swap_token_box',
    'GroupNorm1',
]
