import itertools
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch.nn.modules.batchnorm import _BatchNorm


@torch.no_grad()
def recalibrate_bn(module: nn.Module, batches: Iterable[Any], forward: Callable[[Any], Any],
                   num_batches: int) -> int:
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
        raise ValueError(f'num_batches must be >= 1, got {num_batches}')
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not bns:
        raise ValueError(f'{type(module).__name__} has no BatchNorm with running statistics '
                         'to recalibrate')
    it = iter(batches)
    first = next(it, None)
    if first is None:
        raise ValueError('recalibrate_bn got no batch: the data loader is empty')
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


@HOOKS.register_module()
class BNRecalibrationHook(Hook):
    """Recalibrate the backbone's BatchNorm statistics on training data when training ends.

    After the last training iteration (before the final checkpoint is saved and before the
    final validation) the BatchNorm statistics of ``model.backbone`` are re-estimated with the
    weights frozen over ``num_batches`` training batches, with drop-path off
    (:func:`recalibrate_bn`). SLAB does this for 10 epochs because drop-path shifts the variance
    that BatchNorm sees in training. Works with every mmrepa backbone (any module with
    BatchNorms), and with models that have no ``backbone`` (then the whole model). The model's
    own weights are recalibrated, not ``EMAHook``'s averages. ``tools/recalibrate_bn.py`` does
    the same for a saved checkpoint.

    Args:
        num_batches (int): Training batches to average over. Default: 200.
    """

    priority = 'LOW'  # after EMA updates, before CheckpointHook (VERY_LOW) saves

    def __init__(self, num_batches: int = 200):
        if num_batches < 1:
            raise ValueError(f'num_batches must be >= 1, got {num_batches}')
        self.num_batches = num_batches

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self.is_last_train_iter(runner):
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        used = recalibrate_model_bn(model, runner.train_dataloader, self.num_batches)
        runner.logger.info(f'BNRecalibrationHook: BatchNorm statistics re-estimated on {used} '
                           'training batches (weights frozen, drop-path off)')


def recalibrate_model_bn(model: nn.Module, dataloader: Iterable, num_batches: int) -> int:
    """:func:`recalibrate_bn` on ``model.backbone`` (or ``model``) with an mmengine model's
    data preprocessor (training mode) on ``dataloader``'s batches."""
    target = getattr(model, 'backbone', model)

    def forward(batch):
        data = model.data_preprocessor(batch, True)
        if target is model:
            model(**data, mode='tensor')
        else:
            target(data['inputs'])

    return recalibrate_bn(target, dataloader, forward, num_batches)
