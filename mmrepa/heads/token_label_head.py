"""LV-ViT's classification head with token labelling, for mmpretrain's ``ImageClassifier``."""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from mmpretrain.models.heads import ClsHead
from mmpretrain.structures import DataSample

from ..errors import ConfigError, InputError
from ..layers import TokenBox

TOKEN_LABEL_KEY = 'gt_token_label'


@MODELS.register_module()
class TokenLabelClsHead(ClsHead):
    """A Linear on the class token and an auxiliary Linear on every patch token (LV-ViT).

    It reads every token, ``feats[-1]`` (B, extra + N, C), from a plain ViT with
    ``out_type='raw'``. The class token's scores train with the head's ``loss`` as any
    classification head's. Token labelling (Jiang et al. 2021) adds, when the data samples
    carry dense labels in ``gt_token_label``, ``aux_weight`` times the cross-entropy of each
    patch token's scores against its label (``loss_token``): per sample either class indices
    (h, w) or class scores (num_classes, h, w), on the model's token grid (h · w = N). Without
    them the loss is the plain classification loss.

    At prediction the scores are the class token's plus ``aux_pred_weight`` times each class's
    maximum over the patch tokens (LV-ViT's), once the auxiliary head has been trained on
    token labels (the ``aux_trained`` buffer, kept in checkpoints); before that the auxiliary
    head is untrained and left out.

    After MixToken (the backbone's ``mix_token=True``, which hands over the box with its
    outputs), the class token's target is its image's label mixed with the flipped batch's by
    the box's area, ``lam = 1 - box area / grid area``; the token labels are unchanged (the
    backbone puts the tokens back in their images).

    Args:
        num_classes (int): Classes.
        in_channels (int): Token width.
        num_extra_tokens (int): Tokens before the patch tokens (the class token). Default: 1.
        aux_weight (float): Weight of the token-labelling loss (LV-ViT's ``dense_weight``).
            Default: 1.
        aux_pred_weight (float): Weight of the patch tokens' maximum scores at prediction.
            Default: 0.5.
        **kwargs: :class:`ClsHead` options (``loss``, ``topk``, ``cal_acc``, ``init_cfg``).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        num_extra_tokens: int = 1,
        aux_weight: float = 1.0,
        aux_pred_weight: float = 0.5,
        init_cfg: Optional[dict] = dict(type='TruncNormal', layer='Linear', std=0.02),
        **kwargs,
    ):
        super().__init__(init_cfg=init_cfg, **kwargs)
        if num_classes <= 0:
            raise ConfigError(f'num_classes must be positive, got {num_classes}')
        if num_extra_tokens < 1:
            raise ConfigError(
                'TokenLabelClsHead classifies the class token: num_extra_tokens must be >= 1 '
                f'(a backbone with_cls_token=True), got {num_extra_tokens}'
            )
        self.num_classes, self.num_extra_tokens = num_classes, num_extra_tokens
        self.aux_weight, self.aux_pred_weight = aux_weight, aux_pred_weight
        self.fc = nn.Linear(in_channels, num_classes)
        self.aux_fc = nn.Linear(in_channels, num_classes)
        self.register_buffer('aux_trained', torch.tensor(False))

    def _scores(self, feats: Tuple[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(class-token scores (B, K), patch-token scores (B, N, K))."""
        tokens = feats[-1]
        if tokens.dim() != 3:
            raise ConfigError(
                f'TokenLabelClsHead reads every token (B, N, C), got {tuple(tokens.shape)}: '
                "set the backbone's out_type='raw' and the classifier's neck=None"
            )
        return self.fc(tokens[:, 0]), self.aux_fc(tokens[:, self.num_extra_tokens :])

    def forward(self, feats: Tuple[torch.Tensor]) -> torch.Tensor:
        """The prediction scores (B, num_classes)."""
        cls_score, aux_score = self._scores(feats)
        if not bool(self.aux_trained):
            return cls_score
        return cls_score + self.aux_pred_weight * aux_score.amax(dim=1)

    def loss(self, feats: Tuple[torch.Tensor], data_samples: List[DataSample], **kwargs) -> dict:
        cls_score, aux_score = self._scores(feats)
        box = getattr(feats, 'box', None)  # MixToken's, see mmrepa.layers.mix_token
        if box is None:
            losses = self._get_loss(cls_score, data_samples, **kwargs)
        else:
            losses = self._mixed_loss(cls_score, data_samples, box, **kwargs)
        labels = [TOKEN_LABEL_KEY in s for s in data_samples]
        if not any(labels):
            # the auxiliary head takes part with weight 0: DDP expects a gradient for every
            # parameter in every step
            losses['loss'] = losses['loss'] + 0.0 * aux_score.sum()
            return losses
        if not all(labels):
            raise InputError(
                f'{sum(labels)} of {len(labels)} samples in the batch carry {TOKEN_LABEL_KEY}: '
                'token labels must be given for every sample or for none'
            )
        if 'gt_score' in data_samples[0]:
            raise ConfigError(
                f'{TOKEN_LABEL_KEY} with mixed image labels (gt_score, from Mixup / CutMix '
                'batch augments): the augments mix the images, not their token labels; remove '
                'model.train_cfg.augments when training with token labels'
            )
        target = self._token_targets(data_samples, aux_score.shape[1])
        losses['loss_token'] = self.aux_weight * F.cross_entropy(
            aux_score.reshape(-1, self.num_classes), target
        )
        self.aux_trained.fill_(True)
        return losses

    def _mixed_loss(
        self, cls_score: torch.Tensor, data_samples: List[DataSample], box: TokenBox, **kwargs
    ) -> dict:
        """The class token's loss after MixToken: its target is ``lam`` of its own image's
        label and ``1 - lam`` of the flipped batch's (LV-ViT's TokenLabelCrossEntropy). The
        patch tokens come back in their own images, so their labels stay as they are."""
        if 'gt_score' in data_samples[0]:
            raise ConfigError(
                "MixToken (the backbone's mix_token=True) with Mixup / CutMix batch augments "
                '(gt_score): LV-ViT trains with MixToken instead of them; remove '
                'model.train_cfg.augments or set mix_token=False'
            )
        if self.cal_acc:
            raise ConfigError(
                "cal_acc=True with MixToken (the backbone's mix_token=True): accuracy against "
                "mixed targets means nothing; set the head's cal_acc=False"
            )
        labels = torch.cat([s.gt_label for s in data_samples])
        one_hot = F.one_hot(labels, self.num_classes).to(cls_score.dtype)
        target = box.lam * one_hot + (1.0 - box.lam) * one_hot.flip(0)
        loss = self.loss_module(cls_score, target, avg_factor=cls_score.size(0), **kwargs)
        return {'loss': loss}

    def _token_targets(self, data_samples: List[DataSample], num_tokens: int) -> torch.Tensor:
        """The token labels as (B · N,) class indices or (B · N, K) class scores."""
        labels = torch.stack([s.get(TOKEN_LABEL_KEY) for s in data_samples])
        soft = labels.is_floating_point()
        grid = labels.shape[2:] if soft else labels.shape[1:]
        if (soft and labels.shape[1] != self.num_classes) or len(grid) != 2:
            raise InputError(
                f'{TOKEN_LABEL_KEY} must be (h, w) class indices or ({self.num_classes}, h, w) '
                f'class scores per sample, got {tuple(labels.shape[1:])}'
            )
        if grid[0] * grid[1] != num_tokens:
            raise InputError(
                f'{TOKEN_LABEL_KEY} has a {grid[0]} x {grid[1]} grid, the model {num_tokens} '
                'patch tokens: give token labels on the token grid of the input image'
            )
        if soft:  # (B, K, h, w) -> (B · h · w, K), the tokens' raster order
            return labels.flatten(2).transpose(1, 2).reshape(-1, self.num_classes)
        return labels.reshape(-1).long()
