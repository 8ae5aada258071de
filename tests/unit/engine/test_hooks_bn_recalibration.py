"""BatchNorm recalibration across ranks: average_bn_statistics in 2 gloo processes."""

import os.path as osp

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from mmrepa.engine import average_bn_statistics, recalibrate_bn
from tests.helpers import free_port

# the batches (by index) of rank 0 and rank 1; with unequal counts, rank statistics are
# weighted by their batch counts
SPLITS = {'equal': ((0, 1), (2, 3)), 'unequal': ((0, 1, 2), (3,))}


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(64, 6),
        nn.BatchNorm1d(6),
    )


def batch(i):
    """Batch ``i``: its own offset, so the batch means spread (Var[mean] is far from 0)."""
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(4, 3, 6, 6, generator=g) * (1 + i) + 2.0 * i


def stats(model):
    return {
        k: v.clone()
        for k, v in model.state_dict().items()
        if k.endswith(('running_mean', 'running_var', 'num_batches_tracked'))
    }


def _worker(rank, port, out_dir):
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=2)
    try:
        for name, split in SPLITS.items():
            model = make_model()
            used = recalibrate_bn(model, [batch(i) for i in split[rank]], model, num_batches=10)
            total = average_bn_statistics(model, used)
            torch.save(
                dict(total=total, stats=stats(model)), osp.join(out_dir, f'{name}_rank{rank}.pth')
            )
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope='module')
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp('bn_ranks')
    # spawn, not fork: a worker that ran an OpenVINO model or a process group before has
    # thread pools that a forked child finds locked (the suite hung there)
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=2, start_method='spawn')
    return {
        name: [torch.load(osp.join(out, f'{name}_rank{r}.pth')) for r in (0, 1)] for name in SPLITS
    }


@pytest.mark.processes
@pytest.mark.parametrize('split', sorted(SPLITS))
def test_ranks_end_identical_with_the_statistics_of_all_their_batches(two_ranks, split):
    r0, r1 = two_ranks[split]
    for k in r0['stats']:
        assert torch.equal(r0['stats'][k], r1['stats'][k]), k
    # one process recalibrating on every rank's batches: the same statistics
    everything = [i for part in SPLITS[split] for i in part]
    model = make_model()
    recalibrate_bn(model, [batch(i) for i in everything], model, num_batches=10)
    expected = stats(model)
    assert r0['total'] == len(everything)
    for k, v in expected.items():
        torch.testing.assert_close(r0['stats'][k], v, rtol=1e-5, atol=1e-6, msg=k)
    # the ranks really saw different statistics (else averaging would be invisible)
    alone = make_model()
    recalibrate_bn(alone, [batch(i) for i in SPLITS[split][0]], alone, num_batches=10)
    assert not torch.allclose(stats(alone)['1.running_var'], expected['1.running_var'], rtol=1e-2)


def test_one_process_is_left_alone():
    model = make_model()
    recalibrate_bn(model, [batch(0), batch(1)], model, num_batches=10)
    before = stats(model)
    assert average_bn_statistics(model, 2) == 2
    after = stats(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_recalibration_does_not_reset_a_persistent_training_iterator():
    """With persistent workers, iter(loader) resets the iterator the training loop reads, which
    then runs past max_iters; the hook iterates a loader of its own."""
    from torch.utils.data import DataLoader

    from mmrepa.engine.hooks.bn_recalibration_hook import own_iterator_loader

    loader = DataLoader(list(range(6)), batch_size=1, num_workers=1, persistent_workers=True)
    training = iter(loader)
    seen = [int(next(training)) for _ in range(3)]
    assert [int(b) for b in own_iterator_loader(loader)] == list(range(6))
    seen += [int(b) for b in training]
    assert seen == list(range(6))  # the training iterator went on where it was
