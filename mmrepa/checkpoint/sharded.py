"""Sharded checkpoints of :class:`~mmrepa.engine.FoldableFSDPStrategy` and their consolidation.

A sharded checkpoint is a folder ``NAME.pth/`` with one ``rank{r}.pth`` per rank, each a plain
mmengine checkpoint (tensors, numbers, strings: the restricted loader reads it without a
process group, unlike torch's ``ShardedTensor`` / ``DTensor`` state dicts, whose unpickling
runs code and needs ``init_process_group``). Its ``state_dict`` holds every parameter's piece
on that rank (a flat slice of the flattened parameter, maybe empty) and every buffer whole;
``meta.fsdp_shards`` says where each piece goes: ``{'world_size': N, 'rank': r, 'params':
{name: [shape, start, end]}}``. :func:`consolidate` puts the pieces back together.
"""

import os.path as osp
from typing import Dict

import torch

from ..errors import CheckpointError

SHARD_META = 'fsdp_shards'


def rank_file(folder: str, rank: int) -> str:
    return osp.join(folder, f'rank{rank}.pth')


def consolidate(folder: str) -> dict:
    """One ordinary checkpoint (``state_dict`` of whole tensors, ``meta``) from the sharded
    checkpoint ``folder``. Raises :class:`CheckpointError` (one line) if a rank's file is
    missing or the pieces do not cover every parameter exactly once."""
    from .schemes import load_checkpoint_file

    first = rank_file(folder, 0)
    if not osp.isdir(folder) or not osp.isfile(first):
        raise CheckpointError(
            f'{folder} is not a sharded checkpoint (a folder of rank0.pth, rank1.pth, ...)'
        )
    shards = [load_checkpoint_file(first)]
    info = (shards[0].get('meta') or {}).get(SHARD_META)
    if not info:
        raise CheckpointError(
            f'{first} has no meta.{SHARD_META}: not written by FoldableFSDPStrategy'
        )
    world = info['world_size']
    missing = [r for r in range(1, world) if not osp.isfile(rank_file(folder, r))]
    if missing:
        raise CheckpointError(
            f'{folder}: the checkpoint was written by {world} ranks but rank file(s) '
            f'{", ".join(f"rank{r}.pth" for r in missing)} are missing; copy every rank file'
        )
    shards += [load_checkpoint_file(rank_file(folder, r)) for r in range(1, world)]
    state: Dict[str, torch.Tensor] = {}
    for name, (shape, _, _) in info['params'].items():
        covered = 0
        full = None
        for r, shard in enumerate(shards):
            shape_r, start, end = shard['meta'][SHARD_META]['params'][name]
            piece = shard['state_dict'][name].reshape(-1)
            if list(shape_r) != list(shape) or piece.numel() != end - start:
                raise CheckpointError(f'{rank_file(folder, r)}: the piece of {name} does not fit')
            if full is None:
                full = piece.new_zeros(torch.Size(shape).numel())
            full[start:end] = piece
            covered += end - start
        if covered != full.numel():
            raise CheckpointError(
                f'{folder}: the ranks hold {covered} of the {full.numel()} values of {name}; '
                'the rank files come from different checkpoints or runs'
            )
        state[name] = full.view(shape)
    for name, value in shards[0]['state_dict'].items():
        if name not in info['params']:
            state[name] = value  # buffers: whole on every rank
    meta = {k: v for k, v in (shards[0].get('meta') or {}).items() if k != SHARD_META}
    return dict(meta=meta, state_dict=state)
