"""The demo data generators write what the OpenMMLab data sets (and the demo configs) read.

Shapes are recognised from the files alone: a shape is filled with one colour, and its area
over its squared largest centroid distance tells the kinds apart whatever the rotation
(circle pi, square 2, triangle 1.3).
"""

import json
import os
import os.path as osp

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.utils import import_modules_from_strings
from PIL import Image
from scipy import ndimage

from mmrepa.datasets import (
    SEG_CLASSES,
    SHAPE_CLASSES,
    make_shapes_ade20k,
    make_shapes_classification,
    make_shapes_coco,
)
from tests.helpers import ROOT

DEMO = osp.join(ROOT, 'configs', 'demo')


def shape_kind(mask: np.ndarray) -> str:
    ys, xs = np.nonzero(mask)
    r2 = ((ys - ys.mean()) ** 2 + (xs - xs.mean()) ** 2).max()
    compactness = len(ys) / r2
    return 'triangle' if compactness < 1.65 else 'square' if compactness < 2.55 else 'circle'


def fill_mask(img: np.ndarray, where: np.ndarray = None) -> np.ndarray:
    """Pixels of the most common colour (within ``where``): a lossless image's shape fill."""
    pixels = img[where] if where is not None else img.reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    return np.all(img == colours[counts.argmax()], axis=-1)


def test_classification_set_is_an_mmpretrain_custom_dataset(tmp_path):
    from mmpretrain.datasets import CustomDataset

    root = make_shapes_classification(str(tmp_path), num_train=12, num_val=4, size=64, seed=1)
    for split, count in (('train', 12), ('val', 4)):
        dataset = CustomDataset(data_root=root, data_prefix=split)
        assert len(dataset) == count
        assert dataset.metainfo['classes'] == SHAPE_CLASSES
        for i in range(count):
            info = dataset.get_data_info(i)
            kind = SHAPE_CLASSES[info['gt_label']]
            assert osp.basename(osp.dirname(info['img_path'])) == kind
            img = np.asarray(Image.open(info['img_path']).convert('RGB'))
            assert img.shape == (64, 64, 3)
            mask = fill_mask(img)
            assert mask.sum() > 100  # a large shape, not a few background pixels
            assert shape_kind(mask) == kind


def test_ade20k_set_is_read_by_mmseg_with_ade20k_conventions(tmp_path):
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets import ADE20KDataset
    from mmseg.datasets.transforms import LoadAnnotations

    from mmrepa.datasets import ShapesADE20KDataset

    root = make_shapes_ade20k(str(tmp_path), num_train=6, num_val=3, size=96, seed=2)
    for split in ('training', 'validation'):
        images = sorted(os.listdir(osp.join(root, 'images', split)))
        labels = sorted(os.listdir(osp.join(root, 'annotations', split)))
        assert all(f.endswith('.jpg') for f in images)
        assert [f[:-4] for f in images] == [f[:-4] for f in labels]
    dataset = ShapesADE20KDataset(
        data_root=root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=[LoadImageFromFile(), LoadAnnotations()],
    )
    assert isinstance(dataset, ADE20KDataset) and dataset.reduce_zero_label
    assert dataset.metainfo['classes'] == SEG_CLASSES and len(dataset) == 6
    seen = set()
    for i in range(len(dataset)):
        item = dataset[i]
        seg, img = item['gt_seg_map'], item['img'][..., ::-1]  # BGR -> RGB
        raw = np.asarray(Image.open(item['seg_map_path']))
        # reduce_zero_label: raw 0 (the outlines) is ignored, raw 1 + k is class k
        assert np.array_equal(seg == 255, raw == 0)
        assert np.array_equal(seg[raw > 0], raw[raw > 0] - 1)
        assert 0 < (seg == 255).mean() < 0.1
        regions, count = ndimage.label((seg != 0) & (seg != 255))
        for k in range(1, count + 1):
            region = regions == k
            labels = np.unique(seg[region])
            assert len(labels) == 1
            kind = SEG_CLASSES[labels[0]]
            seen.add(kind)
            assert shape_kind(region) == kind
            # the label covers one drawn fill (JPEG blurs the colour a little)
            inner = ndimage.binary_erosion(region, iterations=2)
            assert img[inner].std(axis=0).max() < 8
    assert seen == set(SHAPE_CLASSES)


def test_coco_set_masks_are_the_drawn_shapes(tmp_path):
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations

    root = make_shapes_coco(str(tmp_path), num_train=6, num_val=2, size=128, seed=3)
    dataset = CocoDataset(
        data_root=root,
        ann_file='annotations/train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=SHAPE_CLASSES),
        filter_cfg=dict(filter_empty_gt=False),
        pipeline=[LoadImageFromFile(), LoadAnnotations(with_bbox=True, with_mask=True)],
    )
    assert len(dataset) == 6
    for i in range(len(dataset)):
        item = dataset[i]
        img = item['img'][..., ::-1]
        masks = item['gt_masks'].to_ndarray().astype(bool)
        assert len(masks) == len(item['gt_bboxes_labels']) > 0
        for mask, box, label in zip(masks, item['gt_bboxes'].numpy(), item['gt_bboxes_labels']):
            x0, y0, x1, y1 = box
            inside = np.zeros_like(mask)
            inside[int(y0) : int(np.ceil(y1)), int(x0) : int(np.ceil(x1))] = True
            assert not (mask & ~inside).any()
            # the polygon mask and the drawn fill (the one colour inside the box) agree up to
            # the one-pixel outline
            fill = fill_mask(img, inside) & inside
            assert (mask & fill).sum() / (mask | fill).sum() > 0.8
            assert shape_kind(mask) == SHAPE_CLASSES[label]


@pytest.mark.parametrize(
    'config, split_dirs',
    [
        ('classifier_repa_caformer_shapes.py', ('train', 'val')),
        ('upernet_repa_convformer_shapes.py', ('images/training', 'images/validation')),
        ('mask-rcnn_prepbn_swin_shapes.py', ('train', 'val')),
    ],
)
def test_demo_configs_read_the_generated_sets(tmp_path, config, split_dirs):
    """Each demo config's train and val data sets, pipelines included, on a tiny set."""
    cfg = Config.fromfile(osp.join(DEMO, config))
    import_modules_from_strings(**cfg.custom_imports)
    registry = __import__(f'{cfg.default_scope}.registry', fromlist=['DATASETS']).DATASETS
    root = str(tmp_path) + '/'
    make = (
        make_shapes_classification
        if 'classifier' in config
        else make_shapes_ade20k
        if 'upernet' in config
        else make_shapes_coco
    )
    make(root, num_train=6, num_val=3)  # the demo's image size
    with open(osp.join(root, 'params.json')) as f:
        size = json.load(f)['size']
    for loader, count in (('train_dataloader', 6), ('val_dataloader', 3)):
        dataset = cfg[loader].dataset
        dataset.data_root = root
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            dataset = registry.build(dataset)
            assert len(dataset) == count
            assert tuple(dataset[0]['inputs'].shape) == (3, size, size)
    assert all(osp.isdir(osp.join(root, d)) for d in split_dirs)


@pytest.mark.parametrize(
    'make, files',
    [
        (make_shapes_classification, ('train', '*/*.png')),
        (make_shapes_ade20k, ('annotations/training', '*.png')),
        (make_shapes_coco, ('train', '*.png')),
    ],
)
def test_generators_are_deterministic_and_idempotent(tmp_path, make, files):
    import glob

    a = make(str(tmp_path / 'a'), num_train=5, num_val=2, seed=4)
    b = make(str(tmp_path / 'b'), num_train=5, num_val=2, seed=4)
    pattern = osp.join(*files)
    found = sorted(glob.glob(osp.join(a, pattern)))
    assert len(found) == 5
    for path in found:
        with open(path, 'rb') as f, open(osp.join(b, osp.relpath(path, a)), 'rb') as g:
            assert f.read() == g.read()
    # the same parameters again: nothing is rewritten
    stamp = osp.getmtime(found[0])
    make(a, num_train=5, num_val=2, seed=4)
    assert osp.getmtime(found[0]) == stamp
    # other parameters: a new set, with no file of the old one left behind
    make(a, num_train=3, num_val=2, seed=4)
    assert len(glob.glob(osp.join(a, pattern))) == 3
