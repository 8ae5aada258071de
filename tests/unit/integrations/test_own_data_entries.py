"""Own data validated entry by entry before training: categories that share an id
(mmdet would map it to the second name and train circles as squares), boxes of no usable size
(dropped by mmdet, leaving nothing to learn), and malformed entries, each one line naming the
file, the entry and the field (issue 39, findings 9 and 11)."""

import json
import os
import os.path as osp
import shutil

import pytest

from mmrepa.apis import load_config
from mmrepa.datasets import make_shapes_ade20k, make_shapes_classification, make_shapes_coco
from mmrepa.datasets.own_data import use_own_data
from mmrepa.errors import ConfigError
from tests.helpers import DEMO, ROOT

NAN = float('nan')


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    return make_shapes_coco(str(tmp_path_factory.mktemp('own') / 'data'), 2, 2, size=32)


def use_with(shapes, tmp_path, change):
    """use_own_data on a copy of the set whose training file went through ``change``."""
    root = tmp_path / 'data'
    (root / 'annotations').mkdir(parents=True)
    for split in ('train', 'val'):
        (root / split).symlink_to(osp.join(shapes, split))
        with open(osp.join(shapes, 'annotations', f'{split}.json')) as f:
            coco = json.load(f)
        coco = change(coco) if split == 'train' else coco
        (root / 'annotations' / f'{split}.json').write_text(
            coco if isinstance(coco, str) else json.dumps(coco)
        )
    return use_own_data(load_config(DEMO), str(root))


def set_(coco, key, value):
    coco[key] = value
    return coco


def first(coco, key, **fields):
    coco[key][0] = dict(coco[key][0], **fields) if fields else coco[key][0]
    return coco


TRAIN = 'annotations/train.json'
CASES = {
    'shared id': (
        lambda c: first(c, 'categories', id=2),
        'categories[0] and categories[1] share the id 2',  # circle's id is square's
    ),
    'nan box': (
        lambda c: first(c, 'annotations', bbox=[1, 1, NAN, 4]),
        'annotations[0].bbox must be [x, y, width, height] with a positive width and height',
    ),
    'negative box': (lambda c: first(c, 'annotations', bbox=[1, 1, -3, 4]), 'not [1, 1, -3, 4]'),
    'category without name': (
        lambda c: set_(c, 'categories', [{'id': 1}]),
        'categories[0].name must be a name, not None',
    ),
    'categories as strings': (
        lambda c: set_(c, 'categories', ['circle']),
        "categories[0].id must be an id, not 'circle'",
    ),
    'categories as a dict': (
        lambda c: set_(c, 'categories', {'1': 'circle'}),
        'categories is a dict, not a list',
    ),
    'unhashable id': (lambda c: first(c, 'categories', id=[1]), 'categories[0].id must be an id'),
    'image without file name': (
        lambda c: set_(c, 'images', [{'id': 1}]),
        'images[0].file_name must be a file name, not None',
    ),
    'annotations not a list': (
        lambda c: set_(c, 'annotations', {'a': 1}),
        'annotations is a dict, not a list',
    ),
    'nested 100000 deep': (
        lambda c: json.dumps(c)[:-1] + ', "x": ' + '[' * 100000 + ']' * 100000 + '}',
        'nested deeper than Python parses',
    ),
}


@pytest.mark.parametrize('case', CASES)
def test_a_malformed_training_file_is_one_line(shapes, tmp_path, case):
    change, message = CASES[case]
    with pytest.raises(ConfigError) as err:
        use_with(shapes, tmp_path, change)
    assert message in str(err.value) and '\n' not in str(err.value), str(err.value)
    assert str(tmp_path / 'data' / TRAIN) in str(err.value)


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    root = make_shapes_ade20k(str(tmp_path_factory.mktemp('own') / 'ade'), 2, 2)
    with open(osp.join(root, 'classes.txt'), 'w') as f:
        f.write('ground\nround\nbox\nwedge\n')
    return root


UPERNET = osp.join(ROOT, 'configs', 'demo', 'upernet_repa_convformer_shapes.py')


def ade_copy(ade, tmp_path):
    root = str(tmp_path / 'ade')
    shutil.copytree(ade, root)
    return root


def test_a_label_map_that_is_no_image_is_one_line(ade, tmp_path):
    root = ade_copy(ade, tmp_path)
    folder = osp.join(root, 'annotations', 'training')
    bad = osp.join(folder, sorted(os.listdir(folder))[-1])
    with open(bad, 'w') as f:
        f.write('not a png')
    with pytest.raises(ConfigError, match=rf'{bad} is not an image PIL reads \(cannot identify'):
        use_own_data(load_config(UPERNET), root)


def test_a_decompression_bomb_is_one_line(ade, tmp_path, monkeypatch):
    from PIL import Image

    root = ade_copy(ade, tmp_path)
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 100)  # 48 x 48 maps: past twice that
    with pytest.raises(ConfigError, match=r'is not an image PIL reads \(Image size \(2304 pixels'):
        use_own_data(load_config(UPERNET), root)


def test_a_class_list_that_is_not_utf8_is_one_line(ade, tmp_path):
    root = ade_copy(ade, tmp_path)
    with open(osp.join(root, 'classes.txt'), 'wb') as f:
        f.write('ground\nr\xf6und\nbox\nwedge\n'.encode('latin-1'))
    with pytest.raises(ConfigError, match=r'classes.txt is not UTF-8 text \(byte 8\)'):
        use_own_data(load_config(UPERNET), root)


def test_a_link_loop_in_a_class_folder_is_one_line(tmp_path):
    root = make_shapes_classification(str(tmp_path / 'cls'), num_train=6, num_val=3)
    loop = osp.join(root, 'train', 'circle', 'loop')
    os.symlink('loop', loop)  # mmpretrain's scan: OSError ELOOP, a traceback
    config = osp.join(ROOT, 'configs', 'demo', 'classifier_repa_caformer_shapes.py')
    with pytest.raises(ConfigError, match=f'{loop}: Too many levels of symbolic links'):
        use_own_data(load_config(config), root)


def every(coco, **fields):
    coco['annotations'] = [dict(a, **fields) for a in coco['annotations']]
    return coco


# a file whose boxes pass the entry check but of which mmdet keeps no object to learn or score
UNUSABLE = {
    'under a pixel': lambda c: every(c, bbox=[1, 1, 0.5, 0.5], area=0.25),
    'outside the image': lambda c: every(c, bbox=[500, 500, 4, 4]),
    'of no listed image': lambda c: every(c, image_id=999),
    'under a pixel wide': lambda c: every(c, bbox=[1, 1, 0.5, 4], area=2),
    'under a pixel high': lambda c: every(c, bbox=[1, 1, 4, 0.5], area=2),
    'of zero area': lambda c: every(c, bbox=[1, 1, 4, 4], area=0),
    'just below the image': lambda c: below_the_image(c),
    'crowds only': lambda c: every(c, iscrowd=1),
    'ignored only': lambda c: every(c, ignore=1),
    'no annotation': lambda c: set_(c, 'annotations', []),
}


@pytest.mark.parametrize('split', ('train', 'val'))
def test_a_split_with_only_dropped_classes_is_one_line(shapes, tmp_path, split):
    """With a class subset, a split whose every object is of a dropped class has nothing."""

    def only_squares(coco):
        square = next(c['id'] for c in coco['categories'] if c['name'] == 'square')
        return every(coco, category_id=square)

    root = tmp_path / 'data'
    (root / 'annotations').mkdir(parents=True)
    for name in ('train', 'val'):
        (root / name).symlink_to(osp.join(shapes, name))
        with open(osp.join(shapes, 'annotations', f'{name}.json')) as f:
            coco = json.load(f)
        coco = only_squares(coco) if name == split else coco
        (root / 'annotations' / f'{name}.json').write_text(json.dumps(coco))
    with pytest.raises(ConfigError, match=f'no object of the classes circle.*the {split} split'):
        use_own_data(load_config(DEMO), str(root), classes=['circle'])


def below_the_image(coco):
    """Every box starts on its image's bottom edge: no pixel inside (mmdet drops it)."""
    height = {image['id']: image['height'] for image in coco['images']}
    for a in coco['annotations']:
        a['bbox'] = [1, height[a['image_id']], 4, 4]
    return coco


@pytest.mark.parametrize('split', ('train', 'val', 'test'))
@pytest.mark.parametrize('case', UNUSABLE)
def test_a_split_with_no_usable_object_is_one_line(shapes, tmp_path, split, case):
    root = tmp_path / 'data'
    (root / 'annotations').mkdir(parents=True)
    for name in ('train', 'val', 'test'):  # the test split reads val's images
        if name != 'test':
            (root / name).symlink_to(osp.join(shapes, name))
        with open(
            osp.join(shapes, 'annotations', f'{"val" if name == "test" else name}.json')
        ) as f:
            coco = json.load(f)
        coco = UNUSABLE[case](coco) if name == split else coco
        (root / 'annotations' / f'{name}.json').write_text(json.dumps(coco))
    with pytest.raises(ConfigError) as err:
        use_own_data(load_config(DEMO), str(root))
    line = str(err.value)
    assert '\n' not in line and str(root / 'annotations' / f'{split}.json') in line, line
    assert f'the {split} split' in line and 'no object of the classes' in line, line
