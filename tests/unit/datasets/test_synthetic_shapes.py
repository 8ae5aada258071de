import json
import os.path as osp

from pycocotools.coco import COCO

from mmrepa.datasets import SHAPE_CLASSES, make_shapes_coco


def test_generated_set_is_valid_coco(tmp_path):
    root = make_shapes_coco(str(tmp_path), num_train=6, num_val=2, size=64, seed=3)
    coco = COCO(osp.join(root, 'annotations', 'train.json'))
    assert len(coco.getImgIds()) == 6
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(SHAPE_CLASSES)
    anns = coco.loadAnns(coco.getAnnIds())
    assert anns
    for ann in anns:
        x, y, w, h = ann['bbox']
        assert 0 <= x and 0 <= y and x + w <= 64 and y + h <= 64 and w > 4 and h > 4
        assert coco.annToMask(ann).sum() > 0
    assert osp.exists(osp.join(root, 'val', '00001.png'))


def test_generation_is_deterministic_and_idempotent(tmp_path):
    a = make_shapes_coco(str(tmp_path / 'a'), num_train=3, num_val=1, size=64, seed=1)
    b = make_shapes_coco(str(tmp_path / 'b'), num_train=3, num_val=1, size=64, seed=1)
    read = lambda r: json.load(open(osp.join(r, 'annotations', 'train.json')))  # noqa: E731
    assert read(a) == read(b)
    stamp = osp.getmtime(osp.join(a, 'annotations', 'train.json'))
    make_shapes_coco(a, num_train=3, num_val=1, size=64, seed=1)
    assert osp.getmtime(osp.join(a, 'annotations', 'train.json')) == stamp
