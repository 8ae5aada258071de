"""TokenLabelCropFlip (LV-ViT's token labels in the pipeline): a label map holding each cell's
own coordinates, cropped and flipped, against the naive crop; the whole transform from a label
file against the map sliced and softmaxed by hand; one-line errors for bad label files.
RandAugment's label-moving ops: a map of coordinates against the affine transforms written out,
the labels following a bright square in the image, the same draws and images as mmpretrain's."""

import argparse
import math

import numpy as np
import pytest
import torch
from mmcv.transforms.utils import cache_random_params
from mmengine.registry import DefaultScope
from mmpretrain.datasets.transforms import RandAugment, Rotate, Shear, Translate

from mmrepa.datasets.token_label import TokenLabelCropFlip, crop_label_map, read_label_map
from mmrepa.datasets.token_label_augment import (
    TokenLabelRandAugment,
    TokenLabelRotate,
    TokenLabelShear,
    TokenLabelTranslate,
)
from mmrepa.errors import CheckpointError, ConfigError, InputError


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    """RandAugment builds its operations in the current default scope: mmpretrain's, as in an
    mmpretrain run (an earlier test in the worker may have left mmdet's)."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def _coordinate_map(h, w):
    """(2, h, w): each cell holds its own (row, column)."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
    return torch.stack([rows, cols]).double()


@pytest.mark.parametrize('flip', [False, True])
def test_a_cell_aligned_crop_is_the_naive_slice(flip):
    """A crop of whole cells onto as many tokens: the map sliced (and reversed left to right)."""
    grid = _coordinate_map(10, 12)
    box = (2 / 10, 3 / 12, 9 / 10, 8 / 12)  # rows 2..8, columns 3..7
    out = crop_label_map(grid, box, (7, 5), flip)
    naive = grid[:, 2:9, 3:8]
    torch.testing.assert_close(out, naive.flip(-1) if flip else naive, rtol=0, atol=1e-12)


@pytest.mark.parametrize('flip', [False, True])
def test_any_crop_inside_the_map_samples_the_coordinates_at_token_centres(flip):
    """A crop not on cell edges, onto a non-square token grid: each token holds the
    coordinates of its centre in the map (cell i's centre at i), written out."""
    h, w, size = 12, 16, (5, 7)
    grid = _coordinate_map(h, w)
    top, left, bottom, right = 0.13, 0.21, 0.77, 0.9
    out = crop_label_map(grid, (top, left, bottom, right), size, flip)
    for i in range(size[0]):
        for j in range(size[1]):
            jj = size[1] - 1 - j if flip else j
            row = (top + (i + 0.5) * (bottom - top) / size[0]) * h - 0.5
            col = (left + (jj + 0.5) * (right - left) / size[1]) * w - 0.5
            torch.testing.assert_close(out[:, i, j], grid.new_tensor([row, col]))


def _image_of_its_coordinates(h, w):
    """uint8 (h, w, 3): channel 0 the row, channel 1 the column of each pixel."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
    return np.stack([rows, cols, np.zeros_like(rows)], -1).astype(np.uint8)


def _label_file(folder, k=3, h=16, w=16, classes=None):
    """A release-style label file: top-k scores and indices; the top class of each cell is
    the cell's number (h · w classes), the others fixed."""
    scores = torch.tensor([6.0, 2.0, 1.0][:k]).reshape(k, 1, 1).expand(k, h, w)
    cell = torch.arange(h * w).reshape(h, w).float()
    indices = torch.stack([cell, (cell + 1) % (h * w), (cell + 7) % (h * w)][:k])
    path = folder / 'n01' / 'img_1.pt'
    path.parent.mkdir(parents=True, exist_ok=True)
    data = torch.stack([scores, indices if classes is None else classes]).half()
    torch.save(data, path)
    return data


def test_the_transform_crops_and_flips_the_labels_with_the_image(tmp_path):
    """A 16 x 32 crop of a 64 x 96 image whose label map has 4-pixel cells, onto 4 x 8 tokens:
    found from the image's pixels (each holds its coordinates), the crop's cells sliced from the
    dense map by hand and softmaxed equal the transform's labels, flipped with the image."""
    data = _label_file(tmp_path, h=16, w=24).float()
    dense = torch.zeros(384, 16, 24)
    for k in range(3):
        for r in range(16):
            for c in range(24):
                dense[int(data[1, k, r, c]), r, c] = data[0, k, r, c]
    transform = TokenLabelCropFlip(
        scale=(16, 32),
        label_root=str(tmp_path),
        label_size=(4, 8),
        num_classes=384,
        crop_ratio_range=(1 / 12, 1 / 12),  # 512 of 6144 pixels
        aspect_ratio_range=(2.0, 2.0),  # 16 x 32
    )
    seen = set()
    for seed in range(300):
        np.random.seed(seed)
        img = _image_of_its_coordinates(64, 96)
        out = transform(dict(img=img, img_path='/data/train/n01/img_1.JPEG'))
        flip = out['flip']
        corner = out['img'][0, -1] if flip else out['img'][0, 0]
        top, left = int(corner[0]), int(corner[1])
        unflipped = out['img'][:, ::-1] if flip else out['img']
        assert np.array_equal(unflipped, img[top : top + 16, left : left + 32])
        if top % 4 or left % 4:
            continue  # crops on cell edges only: their labels are exact slices
        naive = dense[:, top // 4 : top // 4 + 4, left // 4 : left // 4 + 8].softmax(0)
        label = out['gt_token_label']
        assert label.dtype == torch.float32 and label.shape == (384, 4, 8)
        torch.testing.assert_close(label, naive.flip(-1) if flip else naive)
        seen.add(flip)
        if seen == {False, True}:
            break
    assert seen == {False, True}


def test_bad_label_files_are_refused_in_one_line(tmp_path):
    def run(suffix='.pt', **kw):
        transform = TokenLabelCropFlip(32, str(tmp_path), num_classes=256, label_suffix=suffix)
        img = np.zeros((40, 40, 3), np.uint8)
        with pytest.raises((InputError, CheckpointError)) as e:
            transform(dict(img=img, img_path='/data/train/n01/img_1.JPEG'))
        assert '\n' not in str(e.value)
        return str(e.value)

    assert 'no token-label map' in run()
    _label_file(tmp_path)
    torch.save(torch.zeros(5, 16, 16), tmp_path / 'n01' / 'img_1.pt')
    assert '(2, k, h, w)' in run() and '(5, 16, 16)' in run()
    _label_file(tmp_path, classes=torch.full((3, 16, 16), 300.0))
    assert 'in [0, 256)' in run()
    np.save(tmp_path / 'n01' / 'img_1.npy', np.array([{'a': 1}], dtype=object))
    assert 'not a plain numpy array' in run('.npy')
    torch.save({'x': argparse.ArgumentParser}, tmp_path / 'n01' / 'img_1.pt')
    assert 'argparse.ArgumentParser, which mmrepa does not load' in run()


# --------------------------------------------------------------------------- RandAugment's ops


def _source_pixel(op, kw, x, y, height, width):
    """Where output pixel (x, y) of an image (height, width) came from (pixel centres at whole
    numbers), each op's transform inverted by hand: mmpretrain's Rotate turns clockwise (y
    down) about the image centre or ``center`` and scales by ``scale``, Shear slides rows
    (columns) by ``magnitude`` times their y (x), Translate moves by ``magnitude`` of the size."""
    if op is TokenLabelRotate:
        cx, cy = kw.get('center', ((width - 1) / 2, (height - 1) / 2))
        a, s = math.radians(kw['angle']), kw.get('scale', 1.0)
        dx, dy = x - cx, y - cy
        return cx + (math.cos(a) * dx + math.sin(a) * dy) / s, cy + (
            -math.sin(a) * dx + math.cos(a) * dy
        ) / s
    m, horizontal = kw['magnitude'], kw.get('direction', 'horizontal') == 'horizontal'
    if op is TokenLabelShear:
        return (x - m * y, y) if horizontal else (x, y - m * x)
    return (x - m * width, y) if horizontal else (x, y - m * height)


GEOMETRIC = [
    (TokenLabelRotate, dict(angle=23.0)),
    (TokenLabelRotate, dict(angle=-37.0, center=(10.0, 30.0), scale=0.8)),
    (TokenLabelShear, dict(magnitude=0.3)),
    (TokenLabelShear, dict(magnitude=-0.25, direction='vertical')),
    (TokenLabelTranslate, dict(magnitude=0.3)),
    (TokenLabelTranslate, dict(magnitude=-0.41, direction='vertical')),
]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('op, kw', GEOMETRIC)
def test_each_op_moves_a_map_of_coordinates_as_the_transform_written_out(op, kw, dtype):
    """A 45 x 62 image (awkward cells: 6.4 x 6.9 pixels) whose 7 x 9 map holds each cell's
    (row, column, 1): each output cell holds the cell nearest to where its centre came from, by
    the naive inverse transform, or 1/3 (the fill of 3 classes) where that is off the map."""
    (height, width), (h, w) = (45, 62), (7, 9)
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
    grid = torch.stack([rows, cols, torch.ones_like(rows)]).to(dtype)
    results = dict(img=np.zeros((height, width, 3), np.uint8), gt_token_label=grid)
    out = op(**kw, prob=1.0, random_negative_prob=0.0)(results)['gt_token_label']
    assert out.dtype == dtype and out.shape == (3, h, w)
    checked = outside = 0
    for i in range(h):
        for j in range(w):
            x, y = (j + 0.5) * width / w - 0.5, (i + 0.5) * height / h - 0.5
            x, y = _source_pixel(op, kw, x, y, height, width)
            col, row = (x + 0.5) * w / width - 0.5, (y + 0.5) * h / height - 0.5
            if min(abs(col % 1 - 0.5), abs(row % 1 - 0.5)) < 1e-3:
                continue  # halfway between two cells: either is right
            row, col = round(row), round(col)
            inside = 0 <= row < h and 0 <= col < w
            want = [row, col, 1.0] if inside else [1 / 3] * 3
            torch.testing.assert_close(out[:, i, j], out.new_tensor(want))
            checked, outside = checked + 1, outside + (not inside)
    assert checked >= 0.9 * h * w and 0 < outside < checked


def _square_scene(size=96, cells=12, top=8, left=5, sides=2):
    """A dark image with a bright square over cells [top, top + sides) x [left, left + sides) of
    a cells x cells grid, and its one-hot 2-class map (class 1 the square)."""
    img = np.zeros((size, size, 3), np.uint8)
    px = size // cells
    img[top * px : (top + sides) * px, left * px : (left + sides) * px] = 255
    label = torch.zeros(2, cells, cells)
    label[0] = 1
    label[:, top : top + sides, left : left + sides] = torch.tensor([0.0, 1.0])[:, None, None]
    return img, label


@pytest.mark.parametrize('op, kw', GEOMETRIC)
def test_the_labels_go_where_the_image_goes(op, kw):
    """The op moves the square's pixels by more than a cell; the square's cells in the moved map
    are where they went: their centroids, in cells, agree to within half a cell. Every cell
    stays a distribution."""
    img, label = _square_scene()
    out = op(**kw, prob=1.0, random_negative_prob=0.0, pad_val=0)(
        dict(img=img, gt_token_label=label)
    )
    ys, xs = np.nonzero(out['img'][..., 0] > 127)
    row, col = (ys.mean() + 0.5) / 8 - 0.5, (xs.mean() + 0.5) / 8 - 0.5  # in cells
    assert math.hypot(row - 8.5, col - 5.5) > 1
    moved = out['gt_token_label']
    torch.testing.assert_close(moved.sum(0), torch.ones(12, 12))
    rows, cols = torch.nonzero(moved[1] == 1, as_tuple=True)
    assert len(rows) >= 2
    assert abs(rows.double().mean() - row) < 0.5 and abs(cols.double().mean() - col) < 0.5


def test_the_ops_draw_and_move_the_image_as_mmpretrains():
    """Random magnitudes, signs and skips: for the same seed each op, and TokenLabelRandAugment
    with the timm policies, makes mmpretrain's image and leaves numpy's generator where
    mmpretrain's does, with token labels or without; a skipped op leaves the labels alone."""
    pairs = [
        (TokenLabelRotate, Rotate, dict(magnitude_range=(0, 30))),
        (TokenLabelShear, Shear, dict(magnitude_range=(0, 0.3), direction='vertical')),
        (TokenLabelTranslate, Translate, dict(magnitude_range=(0, 0.45))),
        (TokenLabelRandAugment, RandAugment, dict(policies='timm_increasing', num_policies=2)),
    ]
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)
    for ours, theirs, kw in pairs:
        kw = dict(kw, magnitude_level=9, magnitude_std=0.5)
        ours, theirs, skipped = ours(**kw), theirs(**kw), 0
        for seed in range(12):
            label = torch.rand(5, 3, 4).softmax(0)
            np.random.seed(seed)
            want = theirs(dict(img=img.copy()))['img']
            after = np.random.rand()
            for extra in ({}, dict(gt_token_label=label)):
                np.random.seed(seed)
                out = ours(dict(img=img.copy(), **extra))
                assert np.array_equal(out['img'], want) and np.random.rand() == after
            if np.array_equal(want, img):  # skipped: so are the labels
                skipped += 1
                assert torch.equal(out['gt_token_label'], label)
        assert skipped


def test_the_label_moves_by_the_cached_draw_under_cache_random_params():
    """Under mmcv's cache_random_params (one draw for several inputs) every call moves its
    map by the same, cached, rotation."""
    img, label = _square_scene()
    op = TokenLabelRotate(magnitude_range=(0, 30), prob=1.0)
    with cache_random_params(op):
        first, second = (op(dict(img=img, gt_token_label=label)) for _ in range(2))
    assert np.array_equal(first['img'], second['img'])
    assert not torch.equal(first['gt_token_label'], label)
    assert torch.equal(first['gt_token_label'], second['gt_token_label'])


def test_the_randaugment_names_the_label_moving_ops():
    """The timm policies and a policy list, its ops named in any form, get the label-moving
    Rotate, Shear and Translate and keep their other keys; the other ops stay mmpretrain's."""
    timm = TokenLabelRandAugment(policies='timm_increasing', num_policies=2, magnitude_level=9)
    names = [type(t).__name__ for t in timm.transforms]
    assert names.count('TokenLabelShear') == names.count('TokenLabelTranslate') == 2
    assert 'TokenLabelRotate' in names and not {'Rotate', 'Shear', 'Translate'} & set(names)
    assert len(names) == len(RandAugment('timm_increasing', 2, 9).transforms)
    policies = [
        dict(type='mmpretrain.Rotate', magnitude_range=(0, 30)),
        dict(type=Shear, magnitude_range=(0, 0.3), direction='vertical'),
        dict(type='Translate', magnitude=0.2),
        dict(type='Contrast', magnitude_range=(0, 0.9)),
    ]
    listed = TokenLabelRandAugment(policies=policies, num_policies=1, magnitude_level=5).transforms
    assert [type(t) for t in listed[:3]] == [TokenLabelRotate, TokenLabelShear, TokenLabelTranslate]
    assert type(listed[3]).__name__ == 'Contrast'
    assert listed[1].direction == 'vertical' and listed[2].magnitude == 0.2
    with pytest.raises(ConfigError, match='timm_increasing') as e:
        TokenLabelRandAugment(policies='timm', num_policies=2, magnitude_level=9)
    assert '\n' not in str(e.value)

    class MyRotate(Rotate):  # a user's own rotation: its labels would not move
        pass

    with pytest.raises(ConfigError, match='MyRotate is a Rotate.*TokenLabelRotate'):
        TokenLabelRandAugment(
            policies=[dict(type=MyRotate, angle=10.0)], num_policies=1, magnitude_level=5
        )


@pytest.mark.parametrize(
    'label, got', [(torch.zeros(7, 9, dtype=torch.long), '(7, 9)'), ([0.5], 'list')]
)
def test_a_label_map_of_another_form_is_refused_in_one_line(label, got):
    op = TokenLabelTranslate(magnitude=0.1, prob=0.0)  # refused even when the op skips
    with pytest.raises(InputError, match='after TokenLabelCropFlip') as e:
        op(dict(img=np.zeros((8, 8, 3), np.uint8), gt_token_label=label))
    assert got in str(e.value) and 'score map' in str(e.value) and '\n' not in str(e.value)


def test_the_lvvit_configs_commented_pipeline_moves_the_labels(tmp_path):
    """The token-label block commented out at the end of repa_lvvit_s's config, uncommented:
    it builds, names the label-moving RandAugment, and turns an image and its label file into
    a 224 x 224 image and a (1000, 14, 14) distribution per token, with uncovered tokens filled
    for some seed."""
    from mmcv.transforms import Compose
    from mmengine.config import Config
    from mmpretrain.registry import TRANSFORMS
    from PIL import Image

    from tests.helpers import ROOT

    with open(f'{ROOT}/configs/repa_vit/repa_lvvit_s_8xb128_in1k.py') as f:
        lines = f.read().splitlines()
    start = lines.index('# custom_imports = dict(')
    end = next(i for i, line in enumerate(lines) if line.startswith('# train_dataloader'))
    cfg = Config.fromstring('\n'.join(line[2:] for line in lines[start:end]), '.py')
    pipeline = cfg.train_pipeline
    assert [t['type'] for t in pipeline][1:3] == ['TokenLabelCropFlip', 'TokenLabelRandAugment']
    pipeline[1]['label_root'] = str(tmp_path)
    _label_file(tmp_path)  # n01/img_1.pt: 16 x 16 cells, 256 classes
    Image.fromarray(np.full((240, 260, 3), 90, np.uint8)).save(tmp_path / 'n01' / 'img_1.png')
    pipeline = Compose([TRANSFORMS.build(t) for t in pipeline])
    for seed in range(40):  # until a rotation, shear or translation uncovers whole tokens
        np.random.seed(seed)
        out = pipeline(dict(img_path=str(tmp_path / 'n01' / 'img_1.png')))
        assert out['inputs'].shape == (3, 224, 224)
        label = out['data_samples'].gt_token_label
        assert label.shape == (1000, 14, 14)
        # a float32 softmax over 1000 classes, summed again in float32: each sum of 1000
        # non-negative terms within γ_999 ≈ 1000·u32 of 1 (u32 = 2^-24), the exponentials a few
        # u32 more; observed 1.8e-5 (atol was 1e-4, under this worst case)
        tol = (2 * 1000 + 8) * 2**-24
        torch.testing.assert_close(label.sum(0), torch.ones(14, 14), rtol=0, atol=tol)
        if (label == 1 / 1000).all(0).any():  # the fill: no softmaxed map cell is uniform
            break
    else:
        raise AssertionError('no seed moved the labels')


def write_npy(path, array=None, header=None, data=b''):
    """An .npy file of ``array``, or one of ``header`` (a dict) and ``data`` bytes."""
    if array is not None:
        np.save(path, array)
        return str(path)
    with open(path, 'wb') as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(data)
    return str(path)


@pytest.mark.parametrize(
    'kind, message',
    [
        ('empty', 'not a plain numpy array of numbers'),
        ('records', r"its values are \[\('a', '<f4'\)\] \(numbers are needed\)"),
        ('strings', r'its values are <U3 \(numbers are needed\)'),
        ('complex', r'its values are complex64 \(numbers are needed\)'),
        ('huge header', r'declares \(1048576, 1048576\) of float32, more than the file holds'),
    ],
)
def test_npy_label_files_of_another_kind_are_one_line(tmp_path, kind, message):
    path = tmp_path / 'map.npy'
    if kind == 'empty':
        path.write_bytes(b'')
    elif kind == 'huge header':  # 2**40 values declared in a 128-byte file
        header = dict(descr='<f4', fortran_order=False, shape=(2**20, 2**20))
        write_npy(path, header=header)
    else:
        array = {
            'records': np.zeros((2, 1, 3, 3), dtype=[('a', '<f4')]),
            'strings': np.array([['abc']]),
            'complex': np.zeros((2, 1, 3, 3), dtype=np.complex64),
        }[kind]
        write_npy(path, array)
    with pytest.raises(InputError, match=message) as err:
        read_label_map(str(path), num_classes=5)
    assert '\n' not in str(err.value)


def test_a_big_endian_npy_label_map_reads_as_its_values(tmp_path):
    scores = np.linspace(0, 1, 18, dtype='>f4').reshape(1, 1, 3, 6)
    classes = np.arange(18).reshape(1, 1, 3, 6).astype('>f4') % 5
    path = write_npy(tmp_path / 'map.npy', np.concatenate([scores, classes]))
    got_scores, got_classes = read_label_map(path, num_classes=5)
    assert torch.equal(got_scores, torch.from_numpy(scores[0].astype('<f4')))
    assert torch.equal(got_classes, torch.from_numpy(classes[0].astype('<f4')).long())
