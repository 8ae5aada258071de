"""Consolidating sharded checkpoints written by hand, well-formed and malformed: the pieces
must cover every value exactly once, and every size and count is checked against what the
files hold before anything is allocated or looped over (issue 39's malformed shard folders)."""

import pytest
import torch

from mmrepa.checkpoint.sharded import SHARD_META, consolidate
from mmrepa.errors import CheckpointError


def write_ranks(folder, pieces, world=None, shape=(2, 4), extra=None):
    """A sharded checkpoint of one 2 x 4 parameter 'w' and one buffer 'b': ``pieces`` is one
    (start, end) per rank of w's 8 values (0..7); ``extra`` changes rank r's meta."""
    folder.mkdir()
    values = torch.arange(8.0)
    for rank, (start, end) in enumerate(pieces):
        params = {'w': [list(shape), start, end]}
        info = dict(world_size=len(pieces) if world is None else world, rank=rank, params=params)
        info.update((extra or {}).get(rank, {}))
        state = {'w': values[start:end].clone(), 'b': torch.tensor([rank + 0.5])}
        torch.save(
            dict(state_dict=state, meta={SHARD_META: info, 'epoch': 3}), folder / f'rank{rank}.pth'
        )
    return str(folder)


def test_the_pieces_join_and_the_buffers_come_from_rank_0(tmp_path):
    ckpt = consolidate(write_ranks(tmp_path / 'ok.pth', [(4, 8), (0, 4)]))
    assert torch.equal(ckpt['state_dict']['w'], torch.arange(8.0).view(2, 4))
    assert torch.equal(ckpt['state_dict']['b'], torch.tensor([0.5]))
    assert ckpt['meta'] == {'epoch': 3}


@pytest.mark.parametrize(
    'pieces, message',
    [
        ([(0, 2), (3, 8)], 'the pieces of w leave a gap at value 2'),  # [0,2) and [3,8) of 8
        ([(0, 5), (4, 8)], 'the pieces of w overlap at value 4'),
        ([(0, 4), (0, 4)], 'the pieces of w overlap at value 0'),  # both claim [0, 4)
        ([(0, 4), (4, 6)], 'the ranks hold 6 of the 8 values of w'),
    ],
)
def test_pieces_that_do_not_cover_every_value_once_are_refused(tmp_path, pieces, message):
    folder = write_ranks(tmp_path / 'bad.pth', pieces)
    with pytest.raises(CheckpointError, match=message):
        consolidate(folder)


@pytest.mark.parametrize(
    'change, message',
    [
        (dict(world=10**12), 'written by 1000000000000 ranks but holds the rank files rank0.pth'),
        (dict(world='2'), "world_size is '2', not a positive integer"),
        (dict(shape=(10**7, 10**7)), 'the ranks hold 8 of the 100000000000000 values of w'),
        (dict(extra={1: dict(rank=0)}), 'rank1.pth: meta.fsdp_shards is not the one of rank 1'),
        (dict(extra={1: dict(world_size=3)}), 'rank1.pth: meta.fsdp_shards.world_size is 3, not 2'),
        (dict(extra={1: dict(params={})}), 'rank1.pth holds no piece of w'),
        (dict(extra={1: dict(params={'w': [[2, 4], 4, 7]})}), 'the piece of w is not the 3 values'),
        (dict(extra={1: dict(params={'w': 'everything'})}), r"params\['w'\] is not \[shape, start"),
    ],
)
def test_malformed_shard_metadata_is_one_line(tmp_path, change, message):
    folder = write_ranks(tmp_path / 'bad.pth', [(0, 4), (4, 8)], **change)
    with pytest.raises(CheckpointError, match=message) as err:
        consolidate(folder)
    assert '\n' not in str(err.value)


def test_a_missing_rank_file_is_named(tmp_path):
    folder = write_ranks(tmp_path / 'partial.pth', [(0, 4), (4, 8)])
    (tmp_path / 'partial.pth' / 'rank1.pth').unlink()
    with pytest.raises(CheckpointError, match=r'rank file\(s\) rank1.pth are missing'):
        consolidate(folder)
