"""MLP-Mixer with RePaFormer's channel-idle FFN as its channel MLP (RePa-MLPMixer).

With ``idle_ratio=0, ffn_norm='LN'`` the network is timm's and mmpretrain's ``MlpMixer`` and
loads their checkpoints. RePaFormer puts the channel-idle mechanism in the channel MLPs only:
its Table 1 counts (59.9 M -> 24.4 M parameters for b16) are those of folding the channel
MLPs; the token MLPs, which mix a fixed number of patches, stay as they are.
"""

import math
import re
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn.bricks.drop import DropPath
from mmcv.cnn.bricks.transformer import PatchEmbed
from mmengine.model import BaseModule, ModuleList
from mmengine.registry import MODELS

from ..checkpoint.loading import strip_prefixes
from ..errors import CheckpointError, ConfigError, InputError
from ..layers import ChannelIdleFFN, checkpoint_forward
from ..options import check_int, per_stage_ratios
from ..registry import build_activation_layer, build_norm_layer
from .base import DenseBackbone, lookup_arch

# timm's mixer_{s,b,l}{16,32}_224 (the MLP-Mixer paper's Table 1); RePaFormer trains b16, l16.
ARCH_SETTINGS: Dict[str, dict] = {
    f'{size}{patch}': dict(
        embed_dims=dims,
        num_layers=layers,
        tokens_mlp_dims=dims // 2,
        channels_mlp_dims=4 * dims,
        patch_size=patch,
    )
    for size, dims, layers in (('s', 512, 8), ('b', 768, 12), ('l', 1024, 24))
    for patch in (16, 32)
}
# mmpretrain's names of its (patch 16) sizes
ARCH_ALIASES = {
    's': 's16',
    'small': 's16',
    'b': 'b16',
    'base': 'b16',
    'l': 'l16',
    'large': 'l16',
}
ARCH_KEYS = ('embed_dims', 'num_layers', 'tokens_mlp_dims', 'channels_mlp_dims', 'patch_size')
LN = dict(type='LN', eps=1e-6)  # timm's (the JAX release's); mmpretrain's configs use 1e-5


def resolve_arch(arch: Union[str, dict]) -> dict:
    """``'s16' ... 'l32'`` (or mmpretrain's ``'base'`` etc.) or a dict of :data:`ARCH_KEYS`."""
    arch = lookup_arch(arch, ARCH_SETTINGS, ARCH_KEYS, ARCH_ALIASES)
    if set(arch) != set(ARCH_KEYS):
        raise ConfigError(f'a custom arch needs exactly the keys {list(ARCH_KEYS)}, got {arch}')
    for key in ARCH_KEYS:
        check_int(arch[key], f'arch {key}')
    return arch


class TokenMlp(nn.Module):
    """fc1 -> act -> fc2 over the token axis of (B, C, N) (timm's ``Mlp`` names)."""

    def __init__(self, num_tokens: int, hidden: int, act_cfg: dict, drop_rate: float):
        super().__init__()
        self.fc1 = nn.Linear(num_tokens, hidden)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden, num_tokens)
        self.drop = nn.Dropout(drop_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class MixerBlock(BaseModule):
    """``x + mlp_tokens(norm1(x)^T)^T`` then the channel MLP, a :class:`ChannelIdleFFN` that
    owns its pre-norm and shortcut (and folds). (B, N, C) in and out."""

    def __init__(
        self,
        num_tokens: int,
        embed_dims: int,
        tokens_mlp_dims: int,
        ffn_cfg: dict,
        norm_cfg: dict,
        act_cfg: dict,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
    ):
        super().__init__()
        self.with_cp = with_cp
        self.norm1 = build_norm_layer(norm_cfg, embed_dims)[1]
        self.mlp_tokens = TokenMlp(num_tokens, tokens_mlp_dims, act_cfg, drop_rate)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.ffn = ChannelIdleFFN(
            embed_dims,
            act_cfg=act_cfg,
            drop_rate=drop_rate,
            drop_path_rate=drop_path_rate,
            **ffn_cfg,
        )

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return self.ffn(x + self.drop_path(mixed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(self, self._forward, x)
        return self._forward(x)


@MODELS.register_module()
class MLPMixer(DenseBackbone):
    """MLP-Mixer backbone with channel-idle, foldable channel MLPs (RePa-MLPMixer).

    A classification backbone: the token MLPs mix exactly the patches of ``img_size``, so the
    input size is fixed and there is one scale (stride ``patch_size``). It has no detection or
    segmentation form: an input of another size than ``img_size`` is refused in one line.

    Each block is a stage of :class:`DenseBackbone`: ``out_indices`` and ``frozen_stages``
    count blocks (as mmpretrain's ``out_indices`` count layers; negative indices count from
    the end). Outputs are NCHW maps (B, C, H / p, W / p), each through its own norm ``norm{i}``.

    Args:
        arch (str | dict): ``'s16'``, ``'s32'``, ``'b16'``, ``'b32'``, ``'l16'``, ``'l32'``
            (also mmpretrain's ``'small'``/``'base'``/``'large'``: patch 16), or a dict with
            ``embed_dims``, ``num_layers``, ``tokens_mlp_dims``, ``channels_mlp_dims``,
            ``patch_size``. Default: ``'b16'``.
        img_size (int | tuple): The only input size. Default: 224.
        in_channels (int): Input image channels. Default: 3.
        idle_ratio (float | Sequence[float]): Fraction of each channel MLP's hidden channels
            left linear, in [0, 1], one value or one per block. RePaFormer uses 0.75 for b16
            and l16 (one active channel per input channel). Default: 0.75.
        ffn_norm (str): ``'BN'``: the channel MLP has a BatchNorm before ``fc1`` and on the
            hidden layer (everything folds, as RePaFormer); ``'LN'``: the Mixer's LayerNorm
            (``norm_cfg``) before ``fc1`` and no hidden norm (with ``idle_ratio=0``: the
            published MLP-Mixer). Default: ``'BN'``.
        drop_rate (float): Dropout in the MLPs. Default: 0.
        drop_path_rate (float): Stochastic depth, the same in every block (as timm and
            mmpretrain). Default: 0.
        act_cfg (dict): Activation of both MLPs. Default: ``dict(type='GELU')``.
        norm_cfg (dict): The token MLPs' pre-norm (and the channel MLPs' with
            ``ffn_norm='LN'``). Default: LayerNorm, eps 1e-6 (timm's).
        out_norm_cfg (dict, optional): Norm of each output; the last one is the Mixer's final
            norm. Default: LayerNorm, eps 1e-6.
        out_indices (Sequence[int]): Blocks whose outputs are returned. Default: (-1,).
        frozen_stages (int): Freeze the patch embedding (0) and blocks 1..n. Default: -1.
        norm_eval (bool): Keep every BatchNorm in eval mode while training. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded channel MLPs directly. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads timm,
            mmpretrain and mmrepa checkpoints (see :func:`checkpoint_filter_fn`); otherwise
            timm's initialisation.
    """

    stem_name = 'patch_embed'

    def __init__(
        self,
        arch: Union[str, dict] = 'b16',
        img_size: Union[int, Sequence[int]] = 224,
        in_channels: int = 3,
        idle_ratio: Union[float, Sequence[float]] = 0.75,
        ffn_norm: str = 'BN',
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        act_cfg: dict = dict(type='GELU'),
        norm_cfg: dict = LN,
        out_norm_cfg: Optional[dict] = LN,
        out_indices: Sequence[int] = (-1,),
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch)
        self.arch = arch
        self.embed_dims, depth = arch['embed_dims'], arch['num_layers']
        self.patch_size = arch['patch_size']
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if len(self.img_size) != 2 or min(self.img_size) < self.patch_size:
            raise ConfigError(
                f'img_size must be one side or (H, W), each at least the patch size '
                f'{self.patch_size}; got {img_size!r}'
            )
        self.in_channels = in_channels
        self.num_features = [self.embed_dims] * depth
        out_indices = [i + depth if isinstance(i, int) and i < 0 else i for i in out_indices]
        self._check_options(depth, out_indices, frozen_stages, norm_eval, deploy)
        idle_ratios = per_stage_ratios(idle_ratio, depth, 'idle_ratio')
        if ffn_norm not in ('BN', 'LN'):
            raise ConfigError(f"ffn_norm must be 'BN' or 'LN', got {ffn_norm!r}")

        # mmcv's (mmpretrain's) patch embedding: a strided conv, padded up to whole patches
        self.patch_embed = PatchEmbed(
            in_channels=in_channels,
            embed_dims=self.embed_dims,
            conv_type='Conv2d',
            kernel_size=self.patch_size,
            stride=self.patch_size,
            input_size=self.img_size,
        )
        self.patch_grid = tuple(self.patch_embed.init_out_size)
        num_tokens = self.patch_grid[0] * self.patch_grid[1]
        self.stages = ModuleList(
            MixerBlock(
                num_tokens,
                self.embed_dims,
                arch['tokens_mlp_dims'],
                ffn_cfg=dict(
                    mlp_ratio=arch['channels_mlp_dims'] / self.embed_dims,
                    idle_ratio=idle_ratios[i],
                    norm_cfg=dict(type='BN1d') if ffn_norm == 'BN' else norm_cfg,
                    hidden_norm_cfg=dict(type='BN1d') if ffn_norm == 'BN' else None,
                    deploy=deploy,
                ),
                norm_cfg=norm_cfg,
                act_cfg=act_cfg,
                drop_rate=drop_rate,
                drop_path_rate=drop_path_rate,
                with_cp=with_cp,
            )
            for i in range(depth)
        )
        self._setup_outputs(out_norm_cfg)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: ``(B, in_channels, *img_size)`` -> per index in ``out_indices``: (B, C, H/p, W/p)."""
        self._check_input(x, self.patch_size, f'smaller than the patch size {self.patch_size}')
        if tuple(x.shape[2:]) != self.img_size:
            raise InputError(
                f'MLPMixer mixes the {self.patch_grid[0]}x{self.patch_grid[1]} patches of '
                f'{self.img_size[0]}x{self.img_size[1]} images (img_size) and no other '
                f'number; got a {x.shape[2]}x{x.shape[3]} image: resize or crop to img_size'
            )
        x, _ = self.patch_embed(x)
        outs = []
        for i, block in enumerate(self.stages):
            x = block(x)
            if i in self.out_indices:
                out = getattr(self, f'norm{i}')(x)
                outs.append(out.transpose(1, 2).reshape(-1, self.embed_dims, *self.patch_grid))
        return tuple(outs)

    def _default_init(self):
        """timm's: Xavier-uniform Linear weights (MLP biases N(0, 1e-6)), LeCun-normal patch
        embedding, identity norms."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.normal_(m.bias, std=1e-6)
            elif isinstance(m, nn.Conv2d):
                # LeCun normal: truncated at 2 std, the std corrected for the truncation
                fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
                nn.init.trunc_normal_(m.weight, std=1.0, a=-2.0, b=2.0)
                m.weight.data.mul_(math.sqrt(1 / fan_in) / 0.87962566103423978)
                nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, nn.modules.batchnorm._BatchNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def filter_checkpoint(self, state_dict):
        """A timm, mmpretrain or mmrepa MLP-Mixer state dict in our names; see
        :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


# timm's and mmpretrain's names -> ours, per block (after blocks./layers. -> stages.)
_TIMM_BLOCK = (
    ('.mlp_channels.', '.ffn.'),
    ('.norm2.', '.ffn.norm1.'),
)
_MMPRETRAIN_BLOCK = (
    ('.ln1.', '.norm1.'),
    ('.ln2.', '.ffn.norm1.'),
    ('.token_mix.layers.0.0.', '.mlp_tokens.fc1.'),
    ('.token_mix.layers.1.', '.mlp_tokens.fc2.'),
    ('.channel_mix.layers.0.0.', '.ffn.fc1.'),
    ('.channel_mix.layers.1.', '.ffn.fc2.'),
)
_BLOCK = re.compile(r'^(blocks|layers)\.(\d+)\.')


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: MLPMixer) -> dict:
    """Convert an MLP-Mixer state dict to :class:`MLPMixer` names.

    Understands timm's ``mlp_mixer.py`` (``stem.proj``, ``blocks.{i}.mlp_tokens`` /
    ``mlp_channels``, ``norm``, ``head``), mmpretrain's ``MlpMixer`` (``patch_embed``,
    ``layers.{i}.token_mix`` / ``channel_mix``, ``ln1``; also a whole classifier,
    ``backbone.*``) and mmrepa's own (folded or not, matching ``deploy``). The final norm
    becomes the last output norm; the classifier is not loaded (it is listed as unused). A
    checkpoint of another family is refused by name.
    """
    state_dict = strip_prefixes(state_dict)
    timm = 'stem.proj.weight' in state_dict
    mmpretrain = any('.token_mix.' in k for k in state_dict)
    if not (timm or mmpretrain or any('.mlp_tokens.' in k for k in state_dict)):
        raise CheckpointError(
            f'not an MLP-Mixer checkpoint: no token-mixing MLP (mlp_tokens / token_mix) among '
            f'its keys ({", ".join(sorted(state_dict)[:4])}, ...); give MLPMixer a timm, '
            'mmpretrain or mmrepa MLP-Mixer checkpoint'
        )
    last = model.num_stages - 1
    final_norm = 'norm.' if timm else 'ln1.' if mmpretrain else None
    renames = _TIMM_BLOCK if timm else _MMPRETRAIN_BLOCK if mmpretrain else ()
    out = {}
    for k, v in state_dict.items():
        if timm and k.startswith('stem.proj.'):
            k = 'patch_embed.projection.' + k[len('stem.proj.') :]
        elif final_norm and k.startswith(final_norm):
            if not model.has_output_norm(last):
                continue
            k = f'norm{last}.' + k[len(final_norm) :]
        elif _BLOCK.match(k) and (timm or mmpretrain):
            k = _BLOCK.sub(r'stages.\2.', k)
            for old, new in renames:
                k = k.replace(old, new)
        out[k] = v  # the classifier (head.*) is left in, to be reported as unused
    return out
