"""LV-ViT's token labels in an mmpretrain pipeline: the annotator's dense label map of each image,
cropped, resized and flipped with the image (imports mmpretrain and torchvision).

LV-ViT's release (``generate_label.py``) stores per image the top-k class scores and their class
indices on a grid over the image, ``torch.save`` of a (2, k, h, w) tensor in
``<label_root>/<class folder>/<image name>.pt``. Its data pipeline records the random crop box
and flip and applies them to the map with ``roi_align``, then takes a softmax over the classes
(``tlt/data/mixup.py``): :class:`TokenLabelCropFlip` does the same per image. RandAugment's
rotations, shears and translations move the map with the image in the release too: the ops of
:mod:`mmrepa.datasets.token_label_augment` (registered by importing this module).
"""

import math
import os.path as osp
from typing import Sequence, Tuple, Union

import mmcv
import numpy as np
import torch
from mmcv.transforms.utils import cache_randomness
from mmpretrain.datasets.transforms import RandomResizedCrop
from mmpretrain.registry import TRANSFORMS
from torchvision.ops import roi_align

from ..checkpoint import read_restricted, repeats_values
from ..errors import ConfigError, InputError
from ..heads.token_label_head import TOKEN_LABEL_KEY
from .token_label_augment import TokenLabelRandAugment  # noqa: F401 (registers the ops with this import)

LABEL_LAYOUT = (
    "(2, k, h, w): the top-k class scores and their class indices on a grid (LV-ViT's "
    'generate_label.py)'
)


def _read_npy(path: str) -> np.ndarray:
    """A ``.npy`` file of real numbers, its header checked against the file's size before any
    value is read (a header may declare 2**40 values), in the machine's byte order; one line
    for anything else (pickled objects, records, strings, complex numbers, a short file)."""
    fmt = np.lib.format
    try:
        with open(path, 'rb') as f:
            version = fmt.read_magic(f)
            if version not in ((1, 0), (2, 0)):  # 3.0: for non-latin-1 record field names
                raise ValueError(f'format version {version[0]}.{version[1]}')
            read_header = (
                fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
            offset = f.tell()
        if dtype.kind not in 'biuf' or dtype.fields is not None:
            raise ValueError(f'its values are {dtype} (numbers are needed)')
        size = math.prod(shape) * dtype.itemsize
        if size > osp.getsize(path) - offset:
            raise ValueError(f'its header declares {shape} of {dtype}, more than the file holds')
        array = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:  # np.load's, for a file of another kind
        raise InputError(f'{path} is not a plain numpy array of numbers ({err})') from None
    return array.astype(array.dtype.newbyteorder('='), copy=False)


def read_label_map(path: str, num_classes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(scores (k, h, w) float32, classes (k, h, w) int64) of a label file: ``.npy`` read with
    ``allow_pickle=False``, anything else as a file torch saved, without running code
    (:func:`~mmrepa.checkpoint.read_restricted`)."""
    if not osp.isfile(path):
        raise InputError(
            f'no token-label map {path}: label_root must hold one per training image, '
            "<class folder>/<image name> with the label suffix (LV-ViT's label files)"
        )
    if path.endswith('.npy'):
        data = torch.from_numpy(_read_npy(path))
    else:
        data = read_restricted(path, path)
        if isinstance(data, torch.Tensor) and repeats_values(data):
            raise InputError(
                f'{path} holds a view showing its stored values more than once (stride '
                f'{data.stride()}); a token-label map is saved whole'
            )
    if not isinstance(data, torch.Tensor) or data.dim() != 4 or data.shape[0] != 2:
        got = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
        raise InputError(f'{path}: a token-label map is {LABEL_LAYOUT}, got {got}')
    scores, classes = data.float()
    if not bool(torch.isfinite(scores).all()):
        raise InputError(f'{path}: the token-label scores hold NaN or infinite values')
    if (classes != classes.round()).any() or classes.min() < 0 or classes.max() >= num_classes:
        raise InputError(
            f'{path}: its class indices must be whole numbers in [0, {num_classes}) '
            f'(num_classes), they span {classes.min().item():g} to {classes.max().item():g}'
        )
    return scores, classes.long()


def crop_label_map(
    dense: torch.Tensor,
    box: Tuple[float, float, float, float],
    size: Tuple[int, int],
    flip: bool,
) -> torch.Tensor:
    """The crop ``box`` (top, left, bottom, right as fractions of the image) of a map (C, h, w)
    that spans the whole image, resized to ``size`` by ``roi_align`` (each output cell the mean
    of bilinear samples over its part of the box, as LV-ViT's release), then flipped left to
    right if ``flip``. The release passes ``roi_align`` the box's row and column fractions as
    x and y (transposed for any crop not centred on the diagonal); here x is the column."""
    _, h, w = dense.shape
    top, left, bottom, right = box
    roi = dense.new_tensor([[0.0, left * w, top * h, right * w, bottom * h]])
    # aligned=True: a cell's centre sits at +0.5, where the release subtracts 0.5 itself
    out = roi_align(dense[None], roi, output_size=size, aligned=True)[0]
    return out.flip(-1) if flip else out


@TRANSFORMS.register_module()
class TokenLabelCropFlip(RandomResizedCrop):
    """mmpretrain's ``RandomResizedCrop`` then a horizontal flip of the image, with the image's
    token-label map (LV-ViT) read, cropped, resized and flipped alike.

    The map is read from ``label_root`` (``<class folder>/<image stem><label_suffix>``: the
    image's parent folder and name, as LV-ViT's release stores them), made dense (the top-k
    scores at their classes, 0 elsewhere), cropped to the image's crop box and resized to the
    token grid ``label_size`` (``roi_align``), softmaxed over the classes and flipped with the
    image. It goes to ``results['gt_token_label']`` as a (num_classes, h, w) float32 tensor:
    pack it with ``PackInputs(algorithm_keys=('gt_token_label',))`` for
    :class:`~mmrepa.heads.TokenLabelClsHead`. The map is taken to span the whole image, as in
    the release. Transforms after this one that move pixels must move the map too:
    :class:`~mmrepa.datasets.token_label_augment.TokenLabelRandAugment` in place of
    mmpretrain's ``RandAugment`` rotates, shears and translates it with the image, as the
    release does.

    Args:
        scale (int | tuple): The output image size, as ``RandomResizedCrop``.
        label_root (str): The folder of the label files.
        label_size (int | tuple): The token grid (h, w) of the labels: the output size over the
            patch size (224 / 16 = 14). Default: 14.
        num_classes (int): Classes of the label files' indices. Default: 1000.
        flip_prob (float): Probability of the horizontal flip. Default: 0.5.
        label_suffix (str): ``'.pt'`` (the release's ``torch.save`` files) or ``'.npy'``.
            Default: ``'.pt'``.
        **kwargs: ``RandomResizedCrop``'s ``crop_ratio_range``, ``aspect_ratio_range``,
            ``max_attempts``, ``interpolation``, ``backend``.
    """

    def __init__(
        self,
        scale: Union[int, Sequence[int]],
        label_root: str,
        label_size: Union[int, Sequence[int]] = 14,
        num_classes: int = 1000,
        flip_prob: float = 0.5,
        label_suffix: str = '.pt',
        **kwargs,
    ):
        super().__init__(scale, **kwargs)
        if not 0 <= flip_prob <= 1:
            raise ConfigError(f'flip_prob must be in [0, 1], got {flip_prob}')
        size = (label_size, label_size) if isinstance(label_size, int) else tuple(label_size)
        if len(size) != 2 or min(size) < 1:
            raise ConfigError(f'label_size must be a token grid (h, w), got {label_size}')
        self.label_root, self.label_size, self.num_classes = label_root, size, num_classes
        self.flip_prob, self.label_suffix = flip_prob, label_suffix

    @cache_randomness
    def rand_crop_params(self, img: np.ndarray) -> Tuple[int, int, int, int]:
        # the crop RandomResizedCrop draws (and then makes), kept for the label map
        self._crop = super().rand_crop_params(img)
        return self._crop

    @cache_randomness
    def _flips(self) -> bool:
        return bool(np.random.rand() < self.flip_prob)

    def label_path(self, img_path: str) -> str:
        folder = osp.basename(osp.dirname(img_path))
        stem = osp.splitext(osp.basename(img_path))[0]
        return osp.join(self.label_root, folder, stem + self.label_suffix)

    def transform(self, results: dict) -> dict:
        scores, classes = read_label_map(self.label_path(results['img_path']), self.num_classes)
        height, width = results['img'].shape[:2]
        results = super().transform(results)
        top, left, crop_h, crop_w = self._crop
        flip = self._flips()
        if flip:
            results['img'] = mmcv.imflip(results['img'], direction='horizontal')
        results['flip'], results['flip_direction'] = flip, 'horizontal' if flip else None
        dense = scores.new_zeros(self.num_classes, *scores.shape[1:]).scatter_(0, classes, scores)
        box = (top / height, left / width, (top + crop_h) / height, (left + crop_w) / width)
        label = crop_label_map(dense, box, self.label_size, flip).softmax(dim=0)
        results[TOKEN_LABEL_KEY] = label.contiguous()
        return results

    def __repr__(self) -> str:
        return (
            f'{super().__repr__()[:-1]}, label_root={self.label_root!r}, '
            f'label_size={self.label_size}, num_classes={self.num_classes}, '
            f'flip_prob={self.flip_prob})'
        )
