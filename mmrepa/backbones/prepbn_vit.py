"""PRepBN-DeiT and SLAB-DeiT: a plain ViT with progressive re-parameterized BatchNorm (SLAB).

Every norm inside the network is a :class:`~mmrepa.layers.PRepBN`; at test time each folds into
the Linear after it (``qkv``, ``fc1``), so the folded backbone has no norm left but its output
norms.
"""

from typing import Dict, Union

import torch
from mmengine.registry import MODELS

from ..errors import CheckpointError
from .base import PRepBNBackbone
from .repa_vit import RePaViT, checkpoint_filter_fn


@MODELS.register_module()
class PRepBNViT(PRepBNBackbone, RePaViT):
    """Plain ViT / DeiT backbone whose norms are PRepBN, optionally with linear attention.

    :class:`RePaViT` (the same body) with ``norm_cfg=prepbn_cfg`` for both norms of every
    block (the output norms stay LayerNorm). While training each PRepBN computes
    ``λ·LN(x) + (1 − λ)·RepBN(x)`` with λ set by ``PRepBNScheduleHook``; in eval mode it is
    RepBN, and :meth:`reparameterize` folds ``norm1`` into the attention's ``qkv`` and the
    FFN's norm into ``fc1`` (with ``idle_ratio > 0`` the FFN is channel-idle and folds into
    three matrices). At λ = 1 (and ``idle_ratio=0``) the training forward is timm's DeiT.

    ``attn_types='L'``, ``with_cls_token=False``, ``out_type='avg'`` gives SLAB-DeiT:
    simplified linear attention in every block over the whole 14 x 14 token grid (SLAB's
    ``slab_deit.py`` for DeiT-T/S), average pooling instead of the class token.

    Args:
        arch (str | dict): As :class:`RePaViT` (SLAB trains ``'tiny'`` and ``'small'``).
            Default: ``'tiny'``.
        idle_ratio (float): Fraction of FFN hidden channels left linear; 0 is DeiT's FFN.
            Default: 0.
        prepbn_cfg (dict): The norm config; must be affine at inference (``PRepBN`` or
            ``RepBN``). Its eps serves both branches: 1e-6, DeiT's LayerNorm eps, so that
            λ = 1 is DeiT exactly. Default: ``dict(type='PRepBN', eps=1e-6)``.
        **kwargs: Every other :class:`RePaViT` argument (``attn_types``, ``with_cls_token``,
            ``out_type``, ``window_size``, ``drop_path_rate``, ``deploy``, ...).
            ``norm_eval`` freezes the BatchNorm statistics inside the PRepBNs.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads mmrepa
            PRepBNViT checkpoints and LayerNorm ViT checkpoints (timm, mmpretrain, RePaViT
            with ``ffn_norm='LN'``: their LayerNorm weights go to the LN branches).
    """

    def __init__(
        self,
        arch: Union[str, dict] = 'tiny',
        idle_ratio: float = 0.0,
        prepbn_cfg: dict = dict(type='PRepBN', eps=1e-6),
        **kwargs,
    ):
        kwargs = self._prepbn_options(prepbn_cfg, kwargs, 'RePaViT')
        super().__init__(arch=arch, idle_ratio=idle_ratio, **kwargs)
        # an eval-mode RepBN does not normalise before its statistics are learned: start from
        # ViT's init (init_weights applies it again or loads a checkpoint), as PRepBNSwin
        self._default_init()

    def filter_checkpoint(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """:func:`~mmrepa.backbones.repa_vit.checkpoint_filter_fn`, then LayerNorm weights to
        the LN branches; a checkpoint with other BatchNorms (RePaViT's BN FFN) is refused."""
        state_dict = checkpoint_filter_fn(state_dict, self)
        batchnorms = [
            k
            for k in state_dict
            if k.endswith('running_mean') and '.repbn.' not in k and 'patch_embed.' not in k
        ]  # the convolutional patch embedding (LV-ViT's) has its own
        if batchnorms and not self.deploy:
            raise CheckpointError(
                f'not a PRepBNViT checkpoint: {batchnorms[0]!r} is a plain BatchNorm '
                "(RePaViT with ffn_norm='BN'); load it into RePaViT"
            )
        return self.ln_weights_to_prepbn(state_dict)
