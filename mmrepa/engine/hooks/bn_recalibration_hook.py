import itertools
from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn as nn
from mmengine.dist import all_reduce, get_world_size, is_distributed
from mmengine.hooks import EMAHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from ...errors import ConfigError, InputError
from .sharding import is_sharded


@torch.no_grad()
def recalibrate_bn(
    module: nn.Module, batches: Iterable[Any], forward: Callable[[Any], Any], num_batches: int
) -> int:
    """Re-estimate the BatchNorm running statistics of ``module`` with its weights frozen.

    Everything runs in eval mode (no dropout, no drop-path: the statistics then match
    inference, which drop-path's variance shift spoils during training) except the BatchNorm
    layers, whose statistics are reset and replaced by the plain average over the first
    ``num_batches`` batches (momentum ``None``). Only running statistics change
    (``running_mean``, ``running_var``, ``num_batches_tracked``); weights, other buffers,
    momenta and train/eval modes are as before.

    Args:
        module: Whose BatchNorms (``_BatchNorm``, so SyncBN too) are recalibrated.
        batches: Iterable of batches (e.g. the training dataloader).
        forward: Called on every batch; must run ``module`` on it.
        num_batches: Batches to average over.

    Returns:
        The number of batches used (fewer than ``num_batches`` if ``batches`` ran out).
    """
    if num_batches < 1:
        raise ConfigError(f'num_batches must be >= 1, got {num_batches}')
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not bns:
        raise ConfigError(
            f'{type(module).__name__} has no BatchNorm with running statistics to recalibrate'
        )
    it = iter(batches)
    first = next(it, None)
    if first is None:
        raise InputError('recalibrate_bn got no batch: the data loader is empty')
    modes = [(m, m.training) for m in module.modules()]
    momenta = [bn.momentum for bn in bns]
    try:
        module.eval()
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average over the batches
            bn.train()
        used = 0
        for batch in itertools.chain([first], itertools.islice(it, num_batches - 1)):
            forward(batch)
            used += 1
    finally:
        for bn, momentum in zip(bns, momenta):
            bn.momentum = momentum
        for m, training in modes:
            m.training = training
    return used


_STATS = ('running_mean', 'running_var')


@torch.no_grad()
def average_bn_statistics(module: nn.Module, num_batches: int) -> int:
    """Average the recalibrated BatchNorm statistics of ``module`` over the ranks.

    Each rank's ``running_mean`` and ``running_var`` are the plain averages of the per-batch
    means and (unbiased, per-batch) variances over its own ``num_batches`` batches
    (:func:`recalibrate_bn`). The batch-weighted average over the ranks is then exactly what
    one process recalibrating on all ranks' batches computes, for the variance too: BatchNorm's
    running variance is the mean of per-batch variances, each about its own batch mean, so the
    spread of the rank means must not be added (``E[var] + Var[mean]`` would change with how
    the same batches are split over ranks). A SyncBN model already gets identical statistics
    from its forward; averaging leaves them as they are. ``num_batches_tracked`` becomes the
    total batch count. Every rank ends with identical statistics. Without an initialized
    process group of more than one rank nothing changes.

    Args:
        module: Whose BatchNorms (``_BatchNorm`` with running statistics) are averaged; the
            same structure on every rank.
        num_batches: Batches this rank recalibrated on (the weight of its statistics).

    Returns:
        The number of batches over all ranks.
    """
    if not is_distributed() or get_world_size() < 2:
        return num_batches
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not bns:
        return num_batches
    device = bns[0].running_mean.device
    # one reduction: every statistic weighted by this rank's batch count, then the count
    flat = torch.cat(
        [
            getattr(bn, s).reshape(-1).to(device, torch.float64) * num_batches
            for bn in bns
            for s in _STATS
        ]
        + [torch.tensor([float(num_batches)], dtype=torch.float64, device=device)]
    )
    all_reduce(flat, op='sum')
    total = flat[-1].item()
    flat = flat[:-1] / total
    offset = 0
    for bn in bns:
        for s in _STATS:
            stat = getattr(bn, s)
            stat.copy_(flat[offset : offset + stat.numel()].view_as(stat))
            offset += stat.numel()
        bn.num_batches_tracked.fill_(int(round(total)))
    return int(round(total))


@HOOKS.register_module()
class BNRecalibrationHook(Hook):
    """Recalibrate the backbone's BatchNorm statistics on training data when training ends.

    After the last training iteration (before the final checkpoint is saved and before the
    final validation) the BatchNorm statistics of ``model.backbone`` are re-estimated with the
    weights frozen over ``num_batches`` training batches, with drop-path off
    (:func:`recalibrate_bn`). SLAB does this for 10 epochs because drop-path shifts the variance
    that BatchNorm sees in training. Works with every mmrepa backbone (any module with
    BatchNorms), and with models that have no ``backbone`` (then the whole model).
    ``tools/recalibrate_bn.py`` does the same for a saved checkpoint.

    With an ``EMAHook`` the averaged model is recalibrated (with its own weights), since that
    is what the checkpoint's ``state_dict`` holds (EMAHook swaps it in when saving), what
    validation and testing use and what gets deployed. When the EMA does not average buffers
    (``update_buffers=False``, the default) the new statistics are copied into the training
    model too: EMA then shares the training model's buffers (it copies them every iteration and
    validation swaps parameters only), so validation sees them as well.

    Under distributed training every rank recalibrates on its own batches and the statistics
    are then averaged over the ranks (:func:`average_bn_statistics`), so all ranks end
    identical. A sharded (FSDP) model runs its whole forward (FSDP gathers each unit's
    weights there); its BatchNorm statistics are buffers, whole on every rank.

    Args:
        num_batches (int): Training batches to average over (per rank). Default: 200.
    """

    # after EMAHook (NORMAL) updates the averages, which with update_buffers=False also copies
    # the training model's buffers over the averaged model's; before CheckpointHook (VERY_LOW)
    priority = 'LOW'

    def __init__(self, num_batches: int = 200):
        if num_batches < 1:
            raise ConfigError(f'num_batches must be >= 1, got {num_batches}')
        self.num_batches = num_batches

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self.is_last_train_iter(runner):
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        emas = [
            h
            for h in runner.hooks
            if isinstance(h, EMAHook) and getattr(h, 'ema_model', None) is not None
        ]
        targets = [h.ema_model.module for h in emas] or [model]
        loader = own_iterator_loader(runner.train_dataloader)
        # FSDP gathers a unit's weights in its own forward: run the whole sharded model
        through = runner.model if is_sharded(runner.model) else None
        for target in targets:
            used = recalibrate_model_bn(target, loader, self.num_batches, through)
            used = average_bn_statistics(target, used)
        for h in emas:
            if not h.ema_model.update_buffers:
                _copy_bn_statistics(h.ema_model.module, model)
        which = "the EMA model's" if emas else 'the'
        runner.logger.info(
            f'BNRecalibrationHook: {which} BatchNorm statistics re-estimated on '
            f'{used} training batches (weights frozen, drop-path off)'
        )


def own_iterator_loader(loader: Iterable) -> Iterable:
    """A loader over the same batches whose iterator is its own. ``iter()`` on a DataLoader
    with persistent workers resets and returns the one iterator the training loop is still
    reading (torch reuses it): the loop would then run past ``max_iters``, after the
    recalibration, and the saved statistics would be stale."""
    if not (isinstance(loader, DataLoader) and loader.persistent_workers):
        return loader
    return DataLoader(
        loader.dataset,
        batch_sampler=loader.batch_sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
    )


@torch.no_grad()
def _copy_bn_statistics(src: nn.Module, dst: nn.Module) -> None:
    modules = dict(dst.named_modules())
    for name, bn in src.named_modules():
        if isinstance(bn, _BatchNorm) and bn.track_running_stats:
            for s in _STATS + ('num_batches_tracked',):
                getattr(modules[name], s).copy_(getattr(bn, s))


def recalibrate_model_bn(
    model: nn.Module, dataloader: Iterable, num_batches: int, through: Optional[nn.Module] = None
) -> int:
    """:func:`recalibrate_bn` on ``model.backbone`` (or ``model``) with an mmengine model's
    data preprocessor (training mode) on ``dataloader``'s batches. ``through``: the sharded
    (FSDP) model that wraps ``model``, whose whole forward runs instead (the backbone's
    statistics are the same)."""
    target = getattr(model, 'backbone', model)

    def forward(batch):
        data = model.data_preprocessor(batch, True)
        if through is not None:
            through(**data, mode='tensor')
        elif target is model:
            model(**data, mode='tensor')
        else:
            target(data['inputs'])

    return recalibrate_bn(target, dataloader, forward, num_batches)
