import logging
import math
from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ...errors import ConfigError
from .scheduled_scalar_hook import ScheduledScalarHook, check_iters_or_ratio, iterations

JOIN_SCHEDULE_MODES = ('linear', 'cosine', 'exp', 'sqrt')
EXP_RATE = 5.0  # the depth paper's exponential schedule 1 − e^(−5t) (appendix B.2, Eq. 12)


def join_lambda(it: int, begin_iter: int, end_iter: int, mode: str = 'linear') -> float:
    """λ at iteration ``it`` of a joining ramp from 0 at ``begin_iter`` to 1 at ``end_iter``.

    With ``t = (it − begin_iter) / (end_iter − begin_iter)``: λ = 0 for ``t <= 0`` and
    λ = 1.0 exactly for ``t >= 1`` (set explicitly, not computed), and in between

    - ``'linear'``: ``t``
    - ``'cosine'``: ``(1 − cos πt) / 2``
    - ``'exp'``: ``(1 − e^(−5t)) / (1 − e^(−5))``, the paper's ``1 − e^(−5t)`` rescaled so that
      it reaches 1 at t = 1 (unscaled it ends at 0.9933 and the model never folds)
    - ``'sqrt'``: ``√t``

    Every curve is non-decreasing and stays in [0, 1].
    """
    if mode not in JOIN_SCHEDULE_MODES:
        raise ConfigError(f'mode must be one of {JOIN_SCHEDULE_MODES}, got {mode!r}')
    if end_iter <= begin_iter:
        raise ConfigError(f'end_iter ({end_iter}) must be > begin_iter ({begin_iter})')
    if it <= begin_iter:
        return 0.0
    if it >= end_iter:
        return 1.0
    t = (it - begin_iter) / (end_iter - begin_iter)
    if mode == 'linear':
        lam = t
    elif mode == 'cosine':
        lam = (1.0 - math.cos(math.pi * t)) / 2.0
    elif mode == 'exp':
        lam = -math.expm1(-EXP_RATE * t) / -math.expm1(-EXP_RATE)
    else:
        lam = math.sqrt(t)
    return min(1.0, max(0.0, lam))  # rounding must never leave [0, 1]


def join_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """The outermost modules of ``model`` with ``set_join_lambda`` (a JoinedBlock rather than
    its JoinedAttention / JoinedFFN, which the block sets itself), as (name, module)."""
    found: List[Tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not callable(getattr(module, 'set_join_lambda', None)):
            continue
        if any(name.startswith(f'{owner}.') or owner == '' for owner, _ in found):
            continue  # a child of a module that is already set
        found.append((name, module))
    return found


@HOOKS.register_module()
class BranchJoinScheduleHook(ScheduledScalarHook):
    """Set λ of every joined module (:class:`~mmrepa.backbones.depth_rep_vit.JoinedBlock`,
    JoinedAttention, JoinedFFN) from the runner's iteration: the joining ramp λ(t) of the depth
    re-parameterization paper (Zhou et al., §3.3 and appendix B.2).

    Before every training iteration ``it = runner.iter`` (0 for the first), and once in
    ``before_train``, every joined module gets ``λ = join_lambda(it, begin_iter, end_iter,
    mode)`` with ``t = (it − begin_iter) / (end_iter − begin_iter)``:

    - λ = 0 while ``it <= begin_iter`` (independent branches),
    - ``'linear'`` λ = t (the paper's default and best), ``'cosine'`` λ = (1 − cos πt) / 2,
      ``'exp'`` λ = (1 − e^(−5t)) / (1 − e^(−5)) (the paper's 1 − e^(−5t), rescaled to reach 1),
      ``'sqrt'`` λ = √t,
    - λ = 1.0 exactly once ``it >= end_iter`` (the only value at which the block folds).

    λ depends on ``runner.iter`` only (:class:`ScheduledScalarHook`); it is also the
    ``join_lambda`` buffer of every joined layer, saved in checkpoints. ``runner.iter``
    counts data batches: with gradient accumulation k, multiply the paper's optimizer steps
    (10k ramp, then 50k at λ = 1, batch 1024) by k. λ is logged as ``join_lambda``.

    The hook sets the outermost module that has ``set_join_lambda`` (a JoinedBlock sets its
    two sub-layers); the sub-layers of a block are not set a second time. At the end of
    training it warns if any joined layer still has λ < 1: such a model cannot be folded.

    Args:
        end_iter (int, optional): Iteration at which λ reaches 1.0.
        end_ratio (float, optional): The same as a fraction of ``runner.max_iters``. Give
            exactly one of ``end_iter`` and ``end_ratio``.
        begin_iter (int, optional): Last iteration at λ = 0. Default: 0.
        begin_ratio (float, optional): The same as a fraction of ``runner.max_iters``. Give at
            most one of ``begin_iter`` and ``begin_ratio``.
        mode (str): ``'linear'``, ``'cosine'``, ``'exp'`` or ``'sqrt'``. Default: ``'linear'``.

    Example::

        custom_hooks = [dict(type='BranchJoinScheduleHook', begin_iter=0, end_iter=10000)]
    """

    scalar_name = 'join_lambda'
    layer_kind = 'joined module'
    missing_hint = (
        'no module has set_join_lambda; use a backbone built from JoinedBlock with '
        'deploy=False or remove the hook'
    )

    def __init__(
        self,
        end_iter: Optional[int] = None,
        end_ratio: Optional[float] = None,
        begin_iter: Optional[int] = None,
        begin_ratio: Optional[float] = None,
        mode: str = 'linear',
    ):
        name = 'BranchJoinScheduleHook'
        if mode not in JOIN_SCHEDULE_MODES:
            raise ConfigError(
                f'{name}: mode must be one of {JOIN_SCHEDULE_MODES}, got mode={mode!r}'
            )
        check_iters_or_ratio(name, 'end_iter', end_iter, 'end_ratio', end_ratio, True)
        check_iters_or_ratio(name, 'begin_iter', begin_iter, 'begin_ratio', begin_ratio, False)
        if begin_ratio is None and begin_iter is None:
            begin_iter = 0
        # Same unit on both sides: check now; mixed units are checked in resolve.
        for unit, begin, end in (('iter', begin_iter, end_iter), ('ratio', begin_ratio, end_ratio)):
            if begin is not None and end is not None and end <= begin:
                raise ConfigError(
                    f'{name}: end_{unit} must be > begin_{unit}, got '
                    f'begin_{unit}={begin}, end_{unit}={end}'
                )
        self.mode = mode
        self.begin_iter, self.begin_ratio = begin_iter, begin_ratio
        self.end_iter, self.end_ratio = end_iter, end_ratio
        self._begin: int = begin_iter if begin_iter is not None else 0
        self._end: int = end_iter if end_iter is not None else 1

    def _options(self) -> str:
        begin = (
            f'begin_iter={self.begin_iter}'
            if self.begin_ratio is None
            else f'begin_ratio={self.begin_ratio}'
        )
        end = (
            f'end_iter={self.end_iter}' if self.end_ratio is None else f'end_ratio={self.end_ratio}'
        )
        return f'{begin}, {end}'

    def find_layers(self, model: nn.Module) -> List[Tuple[str, nn.Module]]:
        return join_modules(model)

    def resolve(self, runner) -> None:
        max_iters = runner.max_iters
        self._begin = iterations(self.begin_iter, self.begin_ratio, max_iters)
        self._end = iterations(self.end_iter, self.end_ratio, max_iters)
        if self._end <= self._begin:
            raise ConfigError(
                f'BranchJoinScheduleHook: the ramp is empty with {self._options()} '
                f'and max_iters={max_iters} (begin {self._begin}, end {self._end} '
                f'iterations); the end must come after the begin'
            )
        if self._end > max_iters:
            print_log(
                f'BranchJoinScheduleHook: the joining ramp ends at iteration {self._end} '
                f'({self._options()}) but training stops at max_iters={max_iters}; the '
                f'run will end with join_lambda < 1 and the model cannot be folded. '
                f'Lower end_iter / end_ratio or train longer.',
                logger=runner.logger,
                level=logging.WARNING,
            )

    def describe(self) -> str:
        return f'join_lambda 0 -> 1 ({self.mode}) from iteration {self._begin} to {self._end}'

    def value(self, it: int) -> float:
        return join_lambda(it, self._begin, self._end, self.mode)

    def set_layer(self, layer: nn.Module, value: float) -> None:
        layer.set_join_lambda(value)

    def after_train(self, runner) -> None:
        for name, module in self.unwrap(runner).named_modules():
            lam = getattr(module, 'current_join_lambda', None)
            if isinstance(lam, float) and lam < 1.0:
                print_log(
                    f'BranchJoinScheduleHook: training ended with join_lambda = {lam:g} '
                    f'< 1 in {name or "the model"} ({type(module).__name__}) at iteration '
                    f'{runner.iter} ({self._options()}, mode={self.mode!r}); this model '
                    f'cannot be folded: continue training until λ = 1.0',
                    logger=runner.logger,
                    level=logging.WARNING,
                )
                return
