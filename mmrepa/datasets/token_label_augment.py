"""RandAugment's geometric operations moving LV-ViT's token labels with the image (imports
mmpretrain): mmpretrain's ``Rotate``, ``Shear`` and ``Translate`` applying the transform each
drew for the image to ``results['gt_token_label']`` too, and :class:`TokenLabelRandAugment`,
mmpretrain's ``RandAugment`` with those three in its policies.

LV-ViT's release does the same (``tlt/data/random_augment_label.py``): its rotations, shears and
translations move the label map by the image's affine transform at the map's scale with
nearest-cell sampling, while the colour operations leave it alone. Cells that the transform
brings from outside the image (where the image gets its fill colour) hold no object: the release
gives them zero scores, which its softmax turns into 1 / classes for every class, and so do
these operations, on the map already softmaxed.
"""

from typing import Sequence, Tuple

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from mmpretrain.datasets.transforms import RandAugment, Rotate, Shear, Translate
from mmpretrain.datasets.transforms.auto_augment import RANDAUG_POLICIES
from mmpretrain.registry import TRANSFORMS

from ..errors import ConfigError, InputError
from ..heads.token_label_head import TOKEN_LABEL_KEY


def warp_label_map(
    label: torch.Tensor, matrix: np.ndarray, img_shape: Tuple[int, int]
) -> torch.Tensor:
    """A score map (C, h, w) spanning an image of ``img_shape`` (H, W), moved as ``cv2.warpAffine``
    moves the image by ``matrix`` (2 x 3, from input to output pixel coordinates, pixel centres at
    whole numbers). Each cell takes the scores of the cell nearest to where its centre came from,
    or 1 / C for every class where that lies outside the map."""
    height, width = img_shape
    # pixel coordinates to grid_sample's [-1, 1] across the image (align_corners=False): the
    # frame that the image's pixels and the map's cells share whatever the grid's size
    unit = np.array([[2 / width, 0, 1 / width - 1], [0, 2 / height, 1 / height - 1], [0, 0, 1]])
    forward = unit @ np.vstack([matrix, [0, 0, 1]]) @ np.linalg.inv(unit)
    theta = torch.as_tensor(np.linalg.inv(forward)[None, :2], dtype=label.dtype)
    grid = F.affine_grid(theta, [1, 1, *label.shape[1:]], align_corners=False)
    # nearest, as the release: each cell keeps one cell's distribution, never a blend of two
    # objects' along an edge; the extra channel of ones marks the cells that came from the map
    moved = F.grid_sample(
        torch.cat([label, torch.ones_like(label[:1])])[None],
        grid,
        mode='nearest',
        padding_mode='zeros',
        align_corners=False,
    )[0]
    return moved[:-1] + (1 - moved[-1:]) / label.shape[0]


class _MovesTokenLabel:
    """Mixin of a geometric mmpretrain op: the op draws and moves the image as its own class
    does, then the token-label map (if the results have one) moves by the same transform, the
    op's ``pixel_matrix`` of the value it drew."""

    def random_negative(self, value):
        # mmpretrain's draw (cached by it under cache_random_params), recorded on every call:
        # the op's value, the last of its draws; a plain method, so that cached calls record too
        self._value = super().random_negative(value)
        return self._value

    def transform(self, results: dict) -> dict:
        label = results.get(TOKEN_LABEL_KEY)
        if label is not None and not (
            isinstance(label, torch.Tensor) and label.dim() == 3 and label.is_floating_point()
        ):
            got = tuple(label.shape) if hasattr(label, 'shape') else type(label).__name__
            mmpretrain_op = type(self).__bases__[-1].__name__
            raise InputError(
                f"{type(self).__name__} moves results['{TOKEN_LABEL_KEY}'] as a float (classes, "
                f'h, w) score map (TokenLabelCropFlip puts one there), got {got}: put the op '
                f"after TokenLabelCropFlip, or use mmpretrain's {mmpretrain_op}"
            )
        self._value = None  # stays None when the op is skipped
        results = super().transform(results)
        if label is not None and self._value is not None:
            shape = results['img'].shape[:2]
            matrix = self.pixel_matrix(self._value, shape)
            results[TOKEN_LABEL_KEY] = warp_label_map(label, matrix, shape)
        return results


@TRANSFORMS.register_module()
class TokenLabelRotate(_MovesTokenLabel, Rotate):
    """mmpretrain's ``Rotate`` (the same arguments and draws), rotating the token labels with
    the image."""

    def pixel_matrix(self, angle: float, img_shape: Tuple[int, int]) -> np.ndarray:
        height, width = img_shape
        center = ((width - 1) * 0.5, (height - 1) * 0.5) if self.center is None else self.center
        return cv2.getRotationMatrix2D(center, -angle, self.scale)  # as mmcv.imrotate


@TRANSFORMS.register_module()
class TokenLabelShear(_MovesTokenLabel, Shear):
    """mmpretrain's ``Shear`` (the same arguments and draws), shearing the token labels with
    the image."""

    def pixel_matrix(self, magnitude: float, img_shape: Tuple[int, int]) -> np.ndarray:
        if self.direction == 'horizontal':  # as mmcv.imshear: about the first pixel
            return np.array([[1, magnitude, 0], [0, 1, 0]])
        return np.array([[1, 0, 0], [magnitude, 1, 0]])


@TRANSFORMS.register_module()
class TokenLabelTranslate(_MovesTokenLabel, Translate):
    """mmpretrain's ``Translate`` (the same arguments and draws), translating the token labels
    with the image by the same fraction of its size."""

    def pixel_matrix(self, magnitude: float, img_shape: Tuple[int, int]) -> np.ndarray:
        height, width = img_shape
        if self.direction == 'horizontal':
            return np.array([[1, 0, magnitude * width], [0, 1, 0]])
        return np.array([[1, 0, 0], [0, 1, magnitude * height]])


# mmpretrain's op -> the one that moves the labels too
LABEL_MOVING_OPS = {
    Rotate: 'TokenLabelRotate',
    Shear: 'TokenLabelShear',
    Translate: 'TokenLabelTranslate',
}


def _moving_labels(policy):
    op = policy.get('type') if isinstance(policy, dict) else None
    op = TRANSFORMS.get(op) if isinstance(op, str) else op
    label_op = LABEL_MOVING_OPS.get(op) if isinstance(op, type) else None
    if label_op is None and isinstance(op, type) and not issubclass(op, _MovesTokenLabel):
        moved = [base.__name__ for base in LABEL_MOVING_OPS if issubclass(op, base)]
        if moved:  # another op that moves pixels: its labels would stay behind
            raise ConfigError(
                f'policy {op.__name__} is a {moved[0]}, which TokenLabelRandAugment cannot make '
                f'move the token labels: use {moved[0]} or TokenLabel{moved[0]}'
            )
    return policy if label_op is None else {**policy, 'type': label_op}


@TRANSFORMS.register_module()
class TokenLabelRandAugment(RandAugment):
    """mmpretrain's ``RandAugment``, its arguments and draws, with the policies' ``Rotate``,
    ``Shear`` and ``Translate`` (however named: ``'Rotate'``, ``'mmpretrain.Rotate'``, the
    class) replaced by the ops that move ``results['gt_token_label']`` with the image; the other
    policies, which leave the pixels in place, are mmpretrain's. In a pipeline after
    :class:`~mmrepa.datasets.token_label.TokenLabelCropFlip`.

    Args:
        policies (str | list[dict]): ``RandAugment``'s preset name (``'timm_increasing'``, as
            LV-ViT's release) or policy list.
        num_policies, magnitude_level, **kwargs: As ``RandAugment``.
    """

    def __init__(self, policies, num_policies: int, magnitude_level: float, **kwargs):
        if isinstance(policies, str):
            if policies not in RANDAUG_POLICIES:
                raise ConfigError(
                    f"policies {policies!r} is not one of mmpretrain's RandAugment presets "
                    f'({", ".join(RANDAUG_POLICIES)}): name one or give a list of policies'
                )
            policies = RANDAUG_POLICIES[policies]
        if isinstance(policies, Sequence):
            policies = [_moving_labels(policy) for policy in policies]
        super().__init__(policies, num_policies, magnitude_level, **kwargs)
