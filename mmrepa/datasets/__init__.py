from .synthetic_shapes import CLASSES as SHAPE_CLASSES
from .synthetic_shapes import (
    SEG_CLASSES,
    make_shapes_ade20k,
    make_shapes_classification,
    make_shapes_coco,
)

__all__ = [
    'SHAPE_CLASSES',
    'SEG_CLASSES',
    'make_shapes_coco',
    'make_shapes_classification',
    'make_shapes_ade20k',
    'ShapesADE20KDataset',
    'TokenLabelCropFlip',
    'TokenLabelRandAugment',
]


def __getattr__(name):
    # on first use only: they import mmseg / mmpretrain, which `import mmrepa` must not
    if name == 'ShapesADE20KDataset':
        from .shapes_ade20k import ShapesADE20KDataset

        return ShapesADE20KDataset
    if name == 'TokenLabelCropFlip':
        from .token_label import TokenLabelCropFlip

        return TokenLabelCropFlip
    if name == 'TokenLabelRandAugment':
        from .token_label_augment import TokenLabelRandAugment

        return TokenLabelRandAugment
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
