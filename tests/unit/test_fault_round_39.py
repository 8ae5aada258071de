"""Tests written for the survivors of issue 39's round of injected faults (2026-11-27): each
pins one behaviour of the checks changed for issue 39 that the earlier tests left open."""

import pytest
import torch
from torch import nn

from mmrepa.checkpoint.loading import check_dtypes
from mmrepa.checkpoint.sharded import SHARD_META, consolidate
from mmrepa.checkpoint.validation import repeats_values
from mmrepa.datasets.own_data.coco import _check_entries, _finite
from mmrepa.errors import CheckpointError, ConfigError


def write_ranks(folder, pieces, world=None, dtypes=None, params=None):
    """Rank files of one 8-value parameter 'w' (2 x 4): ``pieces`` is (start, end) per rank;
    ``dtypes`` / ``params`` change a rank's piece dtype / meta params."""
    folder.mkdir()
    for rank, (start, end) in enumerate(pieces):
        dtype = (dtypes or {}).get(rank, torch.float32)
        where = (params or {}).get(rank, {'w': [[2, 4], start, end]})
        info = dict(world_size=len(pieces) if world is None else world, rank=rank, params=where)
        state = {'w': torch.arange(8.0)[start:end].to(dtype)}
        torch.save(dict(state_dict=state, meta={SHARD_META: info}), folder / f'rank{rank}.pth')
    return folder


def test_a_stray_file_named_like_a_rank_file_is_not_one(tmp_path):
    folder = write_ranks(tmp_path / 'ok', [(0, 8)])
    (folder / 'rank1.pth.bak').write_bytes(b'an editor backup')
    ckpt = consolidate(str(folder))
    assert torch.equal(ckpt['state_dict']['w'], torch.arange(8.0).view(2, 4))


def test_a_world_size_of_zero_is_not_a_positive_integer(tmp_path):
    folder = write_ranks(tmp_path / 'bad', [(0, 8)], world=0)
    with pytest.raises(CheckpointError, match='world_size is 0, not a positive integer'):
        consolidate(str(folder))


def test_a_piece_that_ends_before_it_starts_is_malformed(tmp_path):
    folder = write_ranks(tmp_path / 'bad', [(0, 4), (4, 8)], params={1: {'w': [[2, 4], 5, 4]}})
    with pytest.raises(CheckpointError, match=r"params\['w'\] is not \[shape, start, end\]"):
        consolidate(str(folder))


def test_a_missing_middle_rank_file_is_named(tmp_path):
    folder = write_ranks(tmp_path / 'partial', [(0, 3), (3, 6), (6, 8)])
    (folder / 'rank1.pth').unlink()  # rank2.pth is still the last: only the count tells
    with pytest.raises(CheckpointError, match=r'rank file\(s\) rank1.pth are missing'):
        consolidate(str(folder))


def test_ranks_that_disagree_on_the_dtype_are_refused(tmp_path):
    folder = write_ranks(tmp_path / 'bad', [(0, 4), (4, 8)], dtypes={1: torch.float64})
    with pytest.raises(CheckpointError, match='disagree on the shape or dtype of w'):
        consolidate(str(folder))


def test_a_view_repeating_its_values_fewer_times_than_its_element_size_repeats():
    assert repeats_values(torch.zeros(1).expand(3))  # 3 values of a 4-byte storage
    assert not repeats_values(torch.zeros(4)[1:])


def test_a_meta_view_repeats_nothing():
    assert not repeats_values(torch.empty(1, device='meta').expand(4))


def test_a_complex_value_for_an_integer_buffer_is_refused():
    module = nn.Module()
    module.register_buffer('count', torch.tensor(3))
    with pytest.raises(CheckpointError, match='count is torch.complex64 in the checkpoint'):
        check_dtypes(module, {'count': torch.tensor(3 + 0j, dtype=torch.complex64)})


def coco(bbox):
    return dict(
        categories=[dict(id=1, name='circle')],
        images=[dict(id=1, file_name='a.png')],
        annotations=[dict(id=1, image_id=1, category_id=1, bbox=bbox)],
    )


@pytest.mark.parametrize('bbox', [[1, 1, 4, 0], [1, 1, 4, 4, 9], [1, 1, True, 4], [1, 1, 4, 1e999]])
def test_a_box_of_no_height_or_not_four_finite_numbers_is_refused(bbox):
    with pytest.raises(ConfigError, match=r'annotations\[0\].bbox must be \[x, y, width, height\]'):
        _check_entries(coco(bbox), 'train.json')
    _check_entries(coco([1, 1, 4, 4]), 'train.json')


def test_finite_takes_real_finite_numbers_only():
    assert _finite(2) and _finite(2.5)
    assert not any(_finite(v) for v in (True, float('inf'), float('nan'), '2', None))


def test_a_npy_file_cut_short_is_refused_from_its_header(tmp_path):
    import numpy as np

    from mmrepa.datasets.token_label import read_label_map
    from mmrepa.errors import InputError

    path = tmp_path / 'map.npy'
    with open(path, 'wb') as f:  # 18 float32 values declared (72 bytes), 8 written
        np.lib.format.write_array_header_1_0(
            f, dict(descr='<f4', fortran_order=False, shape=(2, 1, 3, 3))
        )
        f.write(bytes(8))
    with pytest.raises(InputError, match=r'declares \(2, 1, 3, 3\) of float32, more than the file'):
        read_label_map(str(path), num_classes=5)


def test_a_big_endian_npy_file_is_read_in_the_machines_order(tmp_path):
    import numpy as np

    from mmrepa.datasets.token_label import _read_npy

    path = tmp_path / 'map.npy'
    np.save(path, np.arange(6, dtype='>f4'))
    array = _read_npy(str(path))
    assert array.dtype.isnative and array.tolist() == list(range(6))


def test_an_output_linked_to_an_image_of_the_data_is_a_file_of_the_input(tmp_path):
    import os

    from mmrepa.errors import InputError
    from mmrepa.integrations.cli.outputs import check_outputs

    (tmp_path / 'data' / 'val').mkdir(parents=True)
    (tmp_path / 'data' / 'val' / '00000.png').write_bytes(b'an image')
    link = tmp_path / 'metrics.png'  # outside the data, resolving into it
    os.symlink(tmp_path / 'data' / 'val' / '00000.png', link)
    with pytest.raises(InputError, match='is a file of the input data root'):
        check_outputs(
            'tools/test.py',
            [('--dump-metrics', str(link))],
            [('data root', str(tmp_path / 'data'))],
        )


def test_an_image_listed_twice_is_drawn_once_not_refused(monkeypatch):
    from mmdet.registry import DATASETS
    from mmengine.config import Config

    from tests.helpers import script_module

    class Listed:
        paths = ['/d/val/a.png', '/d/val/a.png', '/d/val/b.png']

        def __len__(self):
            return len(self.paths)

        def get_data_info(self, i):
            return {'img_path': self.paths[i]}

    monkeypatch.setattr(DATASETS, 'build', lambda cfg: Listed())
    cfg = Config(dict(test_dataloader=dict(dataset=dict(type='CocoDataset'))))
    check_picture_names = script_module('tools/test.py').check_picture_names
    check_picture_names(cfg, '/out')  # one image, one picture
    Listed.paths = ['/d/val/a.png', '/d/train/a.png']
    with pytest.raises(ConfigError, match='would both be drawn to /out/a.png'):
        check_picture_names(cfg, '/out')
