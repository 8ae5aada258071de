from .synthetic_shapes import CLASSES as SHAPE_CLASSES
from .synthetic_shapes import make_shapes_coco

__all__ = ['SHAPE_CLASSES', 'make_shapes_coco']
