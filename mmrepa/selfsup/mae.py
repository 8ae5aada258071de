"""DepthRepViT as the encoder of mmpretrain's MAE: the random masking, fixed 2-D sin-cos
position embedding and outputs of mmpretrain's ``MAEViT``, on the joined multi-branch blocks."""

from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
from mmengine.registry import MODELS
from mmpretrain.models import MAEViT
from mmpretrain.models.utils import build_2d_sincos_position_embedding

from ..backbones.depth_rep_vit import DepthRepViT
from ..errors import ConfigError


@MODELS.register_module()
class MAEDepthRepViT(DepthRepViT):
    """DepthRepViT for MAE pre-training, a drop-in for mmpretrain's ``MAEViT`` in
    ``MAE(backbone=...)`` with ``MAEPretrainDecoder``, ``MAEPretrainHead`` and
    ``PixelReconstructionLoss`` as they are.

    ``forward(x)`` embeds the patches, adds the (fixed) position embedding, keeps a random
    ``1 - mask_ratio`` of them with ``MAEViT.random_masking`` itself, prepends the class token
    and returns ``(tokens (B, 1 + kept, C) after the output norm, mask (B, L), ids_restore
    (B, L))`` as ``MAEViT`` does; ``forward(x, mask=None)`` is ``DepthRepViT.forward``.

    Args:
        mask_ratio (float): Fraction of the patches masked. Default: 0.75 (the paper's,
            Table 8).
        out_type (str): Without a mask. Default: ``'raw'`` (as ``MAEViT``).
        **kwargs: As :class:`~mmrepa.backbones.DepthRepViT` (a class token, global
            attention and one output, the last block's).
    """

    def __init__(self, mask_ratio: float = 0.75, out_type: str = 'raw', **kwargs):
        if not 0 <= mask_ratio < 1:
            raise ConfigError(f'mask_ratio must be in [0, 1), got {mask_ratio}')
        for key, wanted in (('with_cls_token', True), ('window_size', None)):
            if kwargs.get(key, wanted) != wanted:
                raise ConfigError(f'MAEDepthRepViT needs {key}={wanted} (as MAEViT)')
        if kwargs.get('out_indices', -1) not in (-1, [-1], (-1,)):
            raise ConfigError('MAEDepthRepViT returns the last block only: out_indices=-1')
        super().__init__(out_type=out_type, **kwargs)
        self.mask_ratio = mask_ratio
        if self.patch_resolution[0] != self.patch_resolution[1]:
            raise ConfigError(
                f'MAE pre-training needs a square patch grid (its sin-cos position embedding '
                f'and pixel target), got {self.patch_resolution}: give a square img_size'
            )
        self.pos_embed.requires_grad = False  # fixed sin-cos while pre-training (as MAE)

    def init_weights(self) -> None:
        """MAE's initialisation (``MAEViT``): Xavier-uniform Linears, each branch as its own
        Linear, and patch embedding; sin-cos position embedding; class token N(0, .02)."""
        super().init_weights()
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            return
        for block in self.stages:
            for layer in (block.attn, block.mlp):
                if layer.deploy:
                    continue
                layer.reset_branch_parameters('xavier_uniform')
        sincos = build_2d_sincos_position_embedding(
            self.patch_resolution[0], self.embed_dims, cls_token=True
        )
        with torch.no_grad():
            self.pos_embed.copy_(sincos.to(self.pos_embed))
            w = self.patch_embed.projection.weight
            nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)

    def forward(
        self, x: torch.Tensor, mask: Optional[bool] = True
    ) -> Union[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        if mask is None or mask is False:
            return super().forward(x)
        self._check_input(x, self.patch_size, f'smaller than the patch size {self.patch_size}')
        tokens, hw_shape = self.patch_embed(x)
        if tuple(hw_shape) != tuple(self.patch_resolution):
            raise ValueError(
                f'MAE pre-training takes {self.patch_resolution} patches (img_size), '
                f'got {tuple(hw_shape)}: crop the images to img_size'
            )
        tokens = tokens + self.pos_embed[:, 1:]
        tokens, mask, ids_restore = MAEViT.random_masking(self, tokens, self.mask_ratio)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        tokens = self.drop_after_pos(torch.cat([cls, tokens], dim=1))
        for block in self.stages:
            tokens = self._run_block(block, tokens, None)
        tokens = getattr(self, f'norm{self.out_indices[-1]}')(tokens)
        if self.diversity_loss_weight > 0 and self.training:
            self._collect_diversity()
        return tokens, mask, ids_restore
