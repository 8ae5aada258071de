"""MAE with attention-map distillation from a frozen teacher ViT: the depth re-parameterization
paper's D-MAE pre-training (§4, "Model setup and notation"; Table 8: an MAE-Base teacher).

The loss is the mean squared error between the teacher's post-softmax attention maps and the
student's maps averaged over its branches (§4), on the same visible tokens in the same order
(the teacher sees the student's mask). Which layers pair is not in the paper; it follows
MAE-Lite (Wang et al., "A Closer Look at Self-Supervised Lightweight Vision Transformers", whose
recipe §4 adopts), which distills the last block's attention into the last block's: the default
``distill_layers=((-1, -1),)``.
"""

import math
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from mmpretrain.models import MAE
from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
from mmpretrain.structures import DataSample

from ..checkpoint.loading import load_state_dict_checked, read_state_dict, strip_prefixes
from ..config.inputs import is_remote
from ..errors import CheckpointError, ConfigError


def vit_attention_maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Post-softmax attention of a plain ViT attention (mmpretrain ``MultiheadAttention`` or
    timm ``Attention``: one ``qkv`` Linear, ``num_heads``) on its input x (B, N, C):
    softmax(Q Kᵀ / √d_h) per head, (B, H, N, N)."""
    B, N, _ = x.shape
    q, k, _ = attn.qkv(x).view(B, N, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)


def attention_distill_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean squared error between the teacher's maps (B, H, N, N) and the student's branch
    maps (B, H, n, N, N) averaged over the branches (the paper's §4)."""
    if student.shape[:2] + student.shape[3:] != teacher.shape:
        raise ValueError(
            f'student maps {tuple(student.shape)} (B, H, n, N, N) do not fit the teacher '
            f'maps {tuple(teacher.shape)} (B, H, N, N): the head and token counts must agree'
        )
    return F.mse_loss(student.mean(dim=2), teacher)


def _visible_ids(ids_restore: torch.Tensor, num_visible: int) -> torch.Tensor:
    """The kept patches' indices in the encoder's order (MAE's ``ids_shuffle[:, :keep]``)."""
    return torch.argsort(ids_restore, dim=1)[:, :num_visible]


@MODELS.register_module()
class DistilledMAE(MAE):
    """mmpretrain's ``MAE`` (encoder, decoder, head and pixel loss as they are) plus
    ``loss_distill``: ``distill_weight`` · the attention distillation loss
    (:func:`attention_distill_loss`) per pair of ``distill_layers``, averaged over the pairs.
    MAE's own loss is logged as ``loss_mae``.

    The teacher is built from ``teacher`` (mmpretrain's registry: ``MAEViT`` or
    ``VisionTransformer`` of the MAE-Base shape) and loaded from ``teacher_checkpoint``
    (mmpretrain layout, alone or inside a model) with mmrepa's restricted loader, every key
    checked; it stays frozen and in eval mode, outside the state dict, the parameters and
    the modules (so not in checkpoints, optimizers or the schedule hooks), and moves with
    ``.to()``. It sees the student's visible patches, in the student's order, with its own
    patch and position embeddings.

    Args:
        backbone (dict): The encoder, e.g. :class:`~mmrepa.selfsup.MAEDepthRepViT`; its
            blocks' ``attn`` must offer ``attention_maps`` (branch maps, (B, H, n, N, N)).
        teacher (dict): The teacher ViT's config.
        teacher_checkpoint (str): Its weights (a path or URL).
        distill_layers (Sequence[tuple]): ``(student block, teacher layer)`` pairs, negative
            counting from the end. Default: ``((-1, -1),)`` (last to last, see above).
        distill_weight (float): Default: 1.0.
        **kwargs: As mmpretrain's ``MAE`` (neck, head, data_preprocessor, init_cfg, ...).
    """

    def __init__(
        self,
        backbone: dict,
        teacher: Optional[dict] = None,
        teacher_checkpoint: Optional[str] = None,
        distill_layers: Sequence[Tuple[int, int]] = ((-1, -1),),
        distill_weight: float = 1.0,
        **kwargs,
    ):
        super().__init__(backbone=backbone, **kwargs)
        if not isinstance(teacher, dict):
            raise ConfigError(
                "DistilledMAE needs teacher=dict(type='MAEViT', arch='b', ...), the teacher "
                "ViT's config (the paper's: an MAE-Base)"
            )
        if distill_weight < 0:
            raise ConfigError(f'distill_weight must be >= 0, got {distill_weight}')
        self.distill_weight = float(distill_weight)
        model = MMPRETRAIN_MODELS.build(teacher)
        _load_teacher(model, teacher_checkpoint)
        model.requires_grad_(False)
        model.eval()  # mmpretrain's backbones' train() returns None: not chained
        self._teacher = (model,)  # a tuple: not a submodule (see the class docstring)
        self.distill_layers = self._check_pairs(distill_layers)

    @property
    def teacher(self) -> nn.Module:
        return self._teacher[0]

    def _check_pairs(self, pairs) -> List[Tuple[int, int]]:
        blocks, layers = len(self.backbone.stages), len(self.teacher.layers)
        if not pairs:
            raise ConfigError('distill_layers is empty: give (student block, teacher layer) pairs')
        checked = []
        for pair in pairs:
            s, t = pair
            if not (-blocks <= s < blocks and -layers <= t < layers):
                raise ConfigError(
                    f'distill_layers pair {tuple(pair)}: the student has {blocks} blocks and '
                    f'the teacher {layers} layers'
                )
            checked.append((s % blocks, t % layers))
        for s, t in checked:
            heads = self.teacher.layers[t].attn.num_heads
            if heads != self.backbone.stages[s].attn.num_heads:
                raise ConfigError(
                    f'teacher layer {t} has {heads} heads, student block {s} '
                    f'{self.backbone.stages[s].attn.num_heads}: their maps cannot be compared '
                    '(the paper gives the student 12 heads, as MAE-Base has)'
                )
        if getattr(self.backbone, 'with_cp', False):
            raise ConfigError("DistilledMAE reads the blocks' attention inputs: set with_cp=False")
        return checked

    def _apply(self, fn, *args, **kwargs):
        super()._apply(fn, *args, **kwargs)
        self.teacher._apply(fn, *args, **kwargs)
        return self

    def loss(self, inputs: torch.Tensor, data_samples: List[DataSample], **kwargs) -> dict:
        """MAE's loss (as ``loss_mae``) and ``loss_distill``."""
        seen: Dict[str, object] = {}
        attns = {s: self.backbone.stages[s].attn for s, _ in self.distill_layers}
        handles = [
            attn.register_forward_pre_hook(
                lambda m, args, s=s: seen.__setitem__(s, args[0]) if s not in seen else None
            )
            for s, attn in attns.items()
        ]
        handles.append(
            self.backbone.register_forward_hook(
                lambda m, args, out: seen.setdefault('encoded', out)
            )
        )
        try:
            losses = super().loss(inputs, data_samples, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        latent, _, ids_restore = seen['encoded']
        visible = _visible_ids(ids_restore, latent.shape[1] - 1)
        teacher_maps = self.teacher_attention_maps(inputs, visible)
        terms = [
            attention_distill_loss(attns[s].attention_maps(seen[s]), teacher_maps[t])
            for s, t in self.distill_layers
        ]
        out = {('loss_mae' if k == 'loss' else k): v for k, v in losses.items()}
        out['loss_distill'] = self.distill_weight * torch.stack(terms).mean()
        return out

    @torch.no_grad()
    def teacher_attention_maps(
        self, inputs: torch.Tensor, visible: torch.Tensor
    ) -> Dict[int, torch.Tensor]:
        """{teacher layer: (B, H, N, N) maps} on the class token and the ``visible`` patches
        (B, kept), in that order, as MAE's encoder arranges them."""
        teacher = self.teacher
        patches = teacher.patch_embed(inputs)[0]
        pos = teacher.pos_embed
        if pos.shape[1] - 1 != patches.shape[1]:
            raise ValueError(
                f'the teacher has {pos.shape[1] - 1} position embeddings, the images give '
                f'{patches.shape[1]} patches: build it for the same img_size and patch_size'
            )
        patches = patches + pos[:, 1:]
        index = visible.unsqueeze(-1).expand(-1, -1, patches.shape[-1])
        x = torch.gather(patches, 1, index)
        cls = (teacher.cls_token + pos[:, :1]).expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1)
        x = getattr(teacher, 'pre_norm', nn.Identity())(x)
        wanted, maps = {t for _, t in self.distill_layers}, {}
        for i, layer in enumerate(teacher.layers[: max(wanted) + 1]):
            if i in wanted:
                maps[i] = vit_attention_maps(layer.attn, layer.ln1(x))
            x = layer(x)
        return maps


def _load_teacher(model: nn.Module, path: Optional[str]) -> None:
    if not path:
        raise ConfigError(
            'DistilledMAE needs teacher_checkpoint: set model.teacher_checkpoint to the '
            "teacher's weights (the paper's: an MAE-Base in mmpretrain's layout)"
        )
    if not is_remote(path) and not osp.isfile(osp.expanduser(path)):
        raise CheckpointError(
            f'teacher checkpoint {path} not found: download an MAE-Base checkpoint there or set '
            'model.teacher_checkpoint=PATH (docs/backbones/depth_rep_vit.md)'
        )
    state = strip_prefixes(read_state_dict(osp.expanduser(path)))
    # the teacher's final norms are never used: its maps come from inside its layers
    load_state_dict_checked(
        model,
        state,
        may_be_missing=('ln1.*', 'ln2.*'),
        source=f'teacher checkpoint {path}',
        hint="a ViT of another size than model.teacher's (arch, patch_size, img_size)",
    )
