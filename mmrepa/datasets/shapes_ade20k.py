"""mmseg's ADE20KDataset with the classes of the generated shapes set (imports mmseg).

mmseg 1.2.2 refuses ``metainfo=dict(classes=...)`` on ``ADE20KDataset`` unless the classes are
a subset of ADE20K's 150 (it builds a label map by name), so the demo set gets a subclass that
changes ``METAINFO`` only: layout, suffixes and ``reduce_zero_label=True`` stay ADE20K's. Import
it through the config (``custom_imports``); ``import mmrepa`` never imports mmseg.
"""

from mmseg.datasets import ADE20KDataset
from mmseg.registry import DATASETS

from .synthetic_shapes import SEG_CLASSES


@DATASETS.register_module()
class ShapesADE20KDataset(ADE20KDataset):
    """:func:`~mmrepa.datasets.make_shapes_ade20k`'s set: ADE20K's layout and label
    convention (0 ignored, ``1 + i`` is class ``i``) with the classes of
    :data:`~mmrepa.datasets.synthetic_shapes.SEG_CLASSES`."""

    METAINFO = dict(
        classes=SEG_CLASSES, palette=[[120, 120, 120], [220, 20, 60], [0, 128, 255], [60, 180, 75]]
    )
