"""TokenLabelCropFlip (LV-ViT's token labels in the pipeline): a label map holding each cell's
own coordinates, cropped and flipped, against the naive crop; the whole transform from a label
file against the map sliced and softmaxed by hand; one-line errors for bad label files."""

import argparse

import numpy as np
import pytest
import torch

from mmrepa.datasets.token_label import TokenLabelCropFlip, crop_label_map
from mmrepa.errors import CheckpointError, InputError


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
