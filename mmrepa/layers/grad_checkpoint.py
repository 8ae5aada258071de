"""Gradient checkpointing that keeps BatchNorm running statistics right.

``torch.utils.checkpoint`` runs a block's forward twice, and a BatchNorm in training mode would
update its running statistics on both runs: the fold would then bake statistics of a batch
counted twice into the weights. Every block that checkpoints goes through
:func:`checkpoint_forward`.
"""

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from torch.nn.modules.batchnorm import _BatchNorm


@contextlib.contextmanager
def batchnorm_statistics_kept(module: nn.Module):
    """While ``module`` is recomputed, its BatchNorms normalise with the batch statistics as
    before but leave ``running_mean``, ``running_var`` and ``num_batches_tracked`` unchanged."""
    bns = [
        m
        for m in module.modules()
        if isinstance(m, _BatchNorm) and m.training and m.track_running_stats
    ]
    # momentum 0 keeps the running averages; momentum=None (cumulative) reads the count, which
    # is restored afterwards.
    saved = [(bn.momentum, bn.num_batches_tracked.clone()) for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    try:
        yield
    finally:
        for bn, (momentum, count) in zip(bns, saved):
            bn.momentum = momentum
            bn.num_batches_tracked.copy_(count)


def checkpoint_forward(module: nn.Module, forward: Callable, *args):
    """``forward(*args)`` through non-reentrant gradient checkpointing when autograd needs it
    (some input requires grad), else a plain call. ``module`` owns the BatchNorms whose
    statistics the recomputation must not touch."""
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return forward(*args)
    return cp.checkpoint(
        forward,
        *args,
        use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), batchnorm_statistics_kept(module)),
    )
