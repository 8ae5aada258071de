from .activations import SquaredReLU, StarReLU, bare_activation, has_output_affine, output_affine
from .basic_mixers import Pooling, RandomMixing
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
from .patch_layers import ConvPatchEmbed, FoldablePatchEmbed, FoldablePatchMerging
from .prenorm_block import PreNormBlock
from .prepbn import PRepBN, RepBN, from_linear_norm
from .res_scale import LayerScale, ResScale
from .sep_conv import SepConv
from .window_attention import (
    ShiftWindowMSA,
    WindowMSA,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from .windowed_self_attention import WindowedSelfAttention

__all__ = [
    'batchnorm_statistics_kept',
    'checkpoint_forward',
    'ChannelIdleFFN',
    'activate_first_',
    'channels_last_norm',
    'num_active_channels',
    'ShiftWindowMSA',
    'WindowMSA',
    'shifted_window_mask',
    'window_partition',
    'window_reverse',
    'SquaredReLU',
    'StarReLU',
    'bare_activation',
    'has_output_affine',
    'output_affine',
    'ResScale',
    'LayerScale',
    'Pooling',
    'RandomMixing',
    'SepConv',
    'WindowedSelfAttention',
    'SimplifiedLinearAttention',
    'ConvPatchEmbed',
    'FoldablePatchEmbed',
    'FoldablePatchMerging',
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
