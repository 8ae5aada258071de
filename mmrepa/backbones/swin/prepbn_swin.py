"""PRepBN-Swin and SLAB-Swin: Swin with progressive re-parameterized BatchNorm (SLAB, Sec. 4.1,
Eq. 2 and 5).

Every norm inside the network is a :class:`~mmrepa.layers.PRepBN`; at test time each folds into
its neighbour (``qkv``, ``fc1``, the patch-merging reduction, the patch-embedding conv), so the
folded backbone has no norm left but the LayerNorms on its outputs.
"""

from typing import Dict, Sequence, Union

import torch
from mmengine.registry import MODELS

from ...checkpoint.loading import resize_to_model, strip_prefixes
from ...layers import from_linear_norm
from ..base import PRepBNBackbone
from .checkpoint import checkpoint_filter_fn
from .repa_swin import RePaSwin


@MODELS.register_module()
class PRepBNSwin(PRepBNBackbone, RePaSwin):
    """Swin Transformer backbone whose norms are PRepBN, optionally with linear attention.

    :class:`RePaSwin` with ``norm_cfg=dict(type='PRepBN')`` everywhere inside the network: the
    block norms, the patch embedding and the patch merging (the output norms ``norm{i}`` stay
    LayerNorm). While training, each PRepBN computes ``λ·LN(x) + (1 − λ)·RepBN(x)`` with λ set by
    ``PRepBNScheduleHook``; in eval mode it is RepBN, and :meth:`reparameterize` folds it away:

    - ``norm1`` into the attention's ``qkv`` (windows padded with the pre-fold ``qkv`` of a zero
      token, so the fold is exact on inputs of any size);
    - the FFN's norm into ``fc1`` (:class:`~mmrepa.layers.ChannelIdleFFN`); with
      ``idle_ratio > 0`` the FFN is channel-idle and folds into three matrices;
    - the patch-merging norm into ``reduction`` (which gains a bias) and the patch-embedding
      norm into the conv (bias scaled too).

    ``attn_types='LLSS'`` gives SLAB-Swin: simplified linear attention in stages 1–2 on windows
    of ``linear_window_sizes`` (56 and 28: each stage's whole map at 224 px), Swin's window
    attention in stages 3–4.

    Args:
        arch (str | dict): ``'tiny'``, ``'small'``, ``'base'`` (or ``t/s/b``), or
            ``dict(embed_dims=..., depths=..., num_heads=...)``. Default: ``'tiny'``.
        idle_ratio (float | Sequence[float]): Fraction of FFN hidden channels left linear, one
            value or one per stage; 0 is Swin's FFN. Default: 0.
        prepbn_cfg (dict): The norm config; must be affine at inference (``PRepBN`` or
            ``RepBN``). Default: ``dict(type='PRepBN')``.
        **kwargs: Every other :class:`RePaSwin` argument (``attn_types``,
            ``linear_window_sizes``, ``drop_path_rate``, ``out_indices``, ``frozen_stages``,
            ``norm_eval``, ``with_cp``, ``deploy``, mmdet's Swin arguments, ...). ``norm_eval``
            freezes the BatchNorm statistics inside the PRepBNs. ``shift_small_maps=False``
            (the ImageNet configs) attends a map no larger than its window as the released Swin
            does, in one window without shift (with ``'LLSS'`` at 224 px also the linear
            stages, whose windows are their maps); True (default) as mmdet's Swin.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads mmrepa,
            mmdet, original and timm Swin checkpoints (LayerNorm weights go to the LN branch)
            and SLAB checkpoints (``LinearNorm``: ``norm1.norm1.*``, ``norm1.norm2.bn.*``,
            ``norm1.norm2.alpha``), see :func:`prepbn_checkpoint_filter_fn`.

    Input (B, in_channels, H, W) of any size; outputs as :class:`RePaSwin`.
    """

    def __init__(
        self,
        arch: Union[str, dict, None] = None,
        idle_ratio: Union[float, Sequence[float]] = 0.0,
        prepbn_cfg: dict = dict(type='PRepBN'),
        **kwargs,
    ):
        kwargs = self._prepbn_options(prepbn_cfg, kwargs, 'RePaSwin')
        super().__init__(arch=arch, idle_ratio=idle_ratio, **kwargs)
        # In eval mode a RepBN does not normalise until its statistics are learned; with
        # PyTorch's default Linear init the residual stream then grows so large that the
        # attention turns chaotic. Start from Swin's init (init_weights applies it again or
        # loads a checkpoint).
        self._default_init()

    def filter_checkpoint(self, state_dict):
        """Any Swin or SLAB layout in PRepBNSwin names; see :func:`prepbn_checkpoint_filter_fn`."""
        return prepbn_checkpoint_filter_fn(state_dict, self)


def prepbn_checkpoint_filter_fn(
    state_dict: Dict[str, torch.Tensor], model: PRepBNSwin
) -> Dict[str, torch.Tensor]:
    """Convert a Swin-family state dict to :class:`PRepBNSwin` names.

    Understands everything :func:`~mmrepa.backbones.swin.checkpoint_filter_fn` does
    (mmrepa, mmdet, original and timm Swin layouts), plus: SLAB ``LinearNorm`` norms
    (``X.norm1.*`` = LayerNorm branch, ``X.norm2.bn.*`` and ``X.norm2.alpha`` = RepBN,
    ``X.iter / X.total_step`` = λ); plain LayerNorm weights where the model has a PRepBN go to
    its LN branch; SLA positional encodings of another window size are resized (bicubic).
    """
    state_dict = checkpoint_filter_fn(from_linear_norm(strip_prefixes(state_dict)), model)
    state_dict = model.ln_weights_to_prepbn(state_dict)
    return resize_to_model(state_dict, model, 'positional_encoding', _resize_positional_encoding)


def _resize_positional_encoding(pe: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    (_, _, C), (_, N2, C2) = pe.shape, shape
    if C != C2:
        return pe  # reported as a shape mismatch by the loader
    # timm's resize with the old behaviour: no antialias (it would change a down-size) and
    # align_corners=False; imported here, on this rare path, because importing timm (an
    # optional extra) takes seconds
    from ...integrations.optional import require

    require('timm', tool='resizing a PRepBN-Swin positional encoding')
    from timm.layers import resample_abs_pos_embed

    side = round(N2**0.5)
    resized = resample_abs_pos_embed(
        pe.float(), (side, side), num_prefix_tokens=0, antialias=False, align_corners=False
    )
    return resized.to(pe.dtype).contiguous()
