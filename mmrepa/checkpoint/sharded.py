"""Sharded checkpoints of :class:`~mmrepa.engine.FoldableFSDPStrategy` and their consolidation.

A sharded checkpoint is a folder ``NAME.pth/`` with one ``rank{r}.pth`` per rank, each a plain
mmengine checkpoint (tensors, numbers, strings: the restricted loader reads it without a
process group, unlike torch's ``ShardedTensor`` / ``DTensor`` state dicts, whose unpickling
runs code and needs ``init_process_group``). Its ``state_dict`` holds every parameter's piece
on that rank (a flat slice of the flattened parameter, maybe empty) and every buffer whole;
``meta.fsdp_shards`` says where each piece goes: ``{'world_size': N, 'rank': r, 'params':
{name: [shape, start, end]}}``. :func:`consolidate` puts the pieces back together.
"""

import math
import os
import os.path as osp
import re
from typing import Dict, List

import torch

from ..errors import CheckpointError

SHARD_META = 'fsdp_shards'


def rank_file(folder: str, rank: int) -> str:
    return osp.join(folder, f'rank{rank}.pth')


def _rank_files(folder: str) -> Dict[int, str]:
    """The ``rank{r}.pth`` files in ``folder``, by rank."""
    found = (re.fullmatch(r'rank(\d+)\.pth', name) for name in os.listdir(folder))
    return {int(m.group(1)): osp.join(folder, m.group(0)) for m in found if m}


def _shard_info(ckpt, path: str, rank: int, world=None) -> dict:
    """``meta.fsdp_shards`` of one rank file, checked: its world size (``world``: the first
    file's), its rank, a ``[shape, start, end]`` of integers for every piece it holds."""
    info = (ckpt.get('meta') or {}).get(SHARD_META) if isinstance(ckpt, dict) else None
    if not isinstance(info, dict):
        raise CheckpointError(
            f'{path} has no meta.{SHARD_META}: not written by FoldableFSDPStrategy'
        )
    size, params = info.get('world_size'), info.get('params')
    if not _is_int(size) or size < 1 or (world is not None and size != world):
        raise CheckpointError(
            f'{path}: meta.{SHARD_META}.world_size is {repr(size)[:40]}, not '
            f'{world or "a positive integer"}'
        )
    if info.get('rank') != rank or not isinstance(params, dict):
        raise CheckpointError(
            f'{path}: meta.{SHARD_META} is not the one of rank {rank} '
            f'(rank {repr(info.get("rank"))[:40]})'
        )
    for name, where in params.items():
        ok = isinstance(where, (list, tuple)) and len(where) == 3
        shape, start, end = where if ok else (None, None, None)
        ok = ok and isinstance(shape, (list, tuple)) and all(_is_int(d) and d >= 0 for d in shape)
        if not (ok and _is_int(start) and _is_int(end) and 0 <= start <= end):
            raise CheckpointError(
                f'{path}: meta.{SHARD_META}.params[{name!r}] is not [shape, start, end]: '
                f'{repr(where)[:80]}'
            )
        state = ckpt.get('state_dict')
        value = state.get(name) if isinstance(state, dict) else None
        if not isinstance(value, torch.Tensor) or value.numel() != end - start:
            raise CheckpointError(
                f'{path}: the piece of {name} is not the {end - start} values its meta says'
            )
    return info


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _load_ranks(folder: str) -> List[dict]:
    """Every rank's checkpoint, each file checked against the first (no more files read than
    the folder holds, whatever the world size says)."""
    from .schemes import load_checkpoint_file

    files = _rank_files(folder) if osp.isdir(folder) else {}
    if 0 not in files:
        raise CheckpointError(
            f'{folder} is not a sharded checkpoint (a folder of rank0.pth, rank1.pth, ...)'
        )
    shards = [load_checkpoint_file(files[0])]
    world = _shard_info(shards[0], files[0], 0)['world_size']
    if len(files) != world or max(files) != world - 1:  # ranks are distinct: 0 .. world - 1
        missing = [r for r in range(1, min(world, max(files) + 2)) if r not in files][:8]
        raise CheckpointError(
            f'{folder}: the checkpoint was written by {world} ranks but holds the rank files '
            f'{", ".join(f"rank{r}.pth" for r in sorted(files)[:8])}'
            + (
                f' (rank file(s) {", ".join(f"rank{r}.pth" for r in missing)} are missing)'
                if missing
                else ''
            )
            + '; copy every rank file of one checkpoint'
        )
    for r in range(1, world):
        shards.append(load_checkpoint_file(files[r]))
        _shard_info(shards[r], files[r], r, world)
    return shards


def _joined(folder: str, name: str, shards: List[dict]) -> torch.Tensor:
    """The parameter ``name`` from its pieces, which must cover its values exactly once."""
    pieces = []
    for r, shard in enumerate(shards):
        where = shard['meta'][SHARD_META]['params'].get(name)
        if where is None:
            raise CheckpointError(f'{rank_file(folder, r)} holds no piece of {name}')
        pieces.append((where[1], where[2], list(where[0]), shard['state_dict'][name]))
    shape = pieces[0][2]
    numel = math.prod(shape)
    if any(p[2] != shape for p in pieces) or len({p[3].dtype for p in pieces}) > 1:
        raise CheckpointError(f'{folder}: the ranks disagree on the shape or dtype of {name}')
    position = 0
    for start, end, _, _ in sorted(pieces, key=lambda p: (p[0], p[1])):
        if start != position:
            wrong = 'overlap' if start < position else 'leave a gap'
            raise CheckpointError(
                f'{folder}: the pieces of {name} {wrong} at value {min(start, position)}; '
                'the rank files come from different checkpoints or runs'
            )
        position = end
    if position != numel:  # checked before anything of that size is allocated
        raise CheckpointError(
            f'{folder}: the ranks hold {position} of the {numel} values of {name}; '
            'the rank files come from different checkpoints or runs'
        )
    full = pieces[0][3].new_empty(numel)
    for start, end, _, piece in pieces:
        full[start:end] = piece.reshape(-1)
    return full.view(shape)


def consolidate(folder: str) -> dict:
    """One ordinary checkpoint (``state_dict`` of whole tensors, ``meta``) from the sharded
    checkpoint ``folder``. Raises :class:`CheckpointError` (one line) if a rank's file is
    missing or malformed, or the pieces do not cover every parameter exactly once; every size is
    checked against the tensors the files hold before anything is allocated."""
    shards = _load_ranks(folder)
    params = shards[0]['meta'][SHARD_META]['params']
    state: Dict[str, torch.Tensor] = {name: _joined(folder, name, shards) for name in params}
    for name, value in shards[0]['state_dict'].items():
        if name not in params:
            state[name] = value  # buffers: whole on every rank
    meta = {k: v for k, v in (shards[0].get('meta') or {}).items() if k != SHARD_META}
    return dict(meta=meta, state_dict=state)
