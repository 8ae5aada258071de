from typing import List, Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...errors import ConfigError
from ...layers import PRepBN


def prepbn_lambda(it: int, warmup_iters: int, decay_iters: int) -> float:
    """λ at iteration ``it``: 1 for ``warmup_iters``, then linear to 0 over ``decay_iters``."""
    if it < warmup_iters:
        return 1.0
    if decay_iters <= 0:
        return 0.0
    return max(0.0, 1.0 - (it - warmup_iters) / decay_iters)


@HOOKS.register_module()
class PRepBNScheduleHook(Hook):
    """Set λ of every :class:`~mmrepa.layers.PRepBN` from the runner's iteration (SLAB).

    Before every training iteration ``it = runner.iter`` (0 for the first), every PRepBN of the
    model gets ``λ = 1`` while ``it < warmup_iters`` (pure LayerNorm), then
    ``λ = max(0, 1 − (it − warmup_iters) / decay_iters)``, reaching pure RepBN after
    ``warmup_iters + decay_iters`` iterations. λ depends on ``runner.iter`` only, so gradient
    checkpointing, gradient accumulation, validation and other extra forward calls do not move
    it, and a resumed run continues the schedule exactly. λ is logged as ``prepbn_lambda``.

    Args:
        warmup_iters (int): Iterations of pure LayerNorm first. Default: 0.
        decay_iters (int, optional): Length of the linear decay in iterations (0: RepBN right
            after the warm-up).
        decay_ratio (float, optional): The decay length as a fraction of the training length
            (``runner.max_iters``). Give exactly one of ``decay_iters`` and ``decay_ratio``.
    """

    priority = 'NORMAL'

    def __init__(
        self,
        warmup_iters: int = 0,
        decay_iters: Optional[int] = None,
        decay_ratio: Optional[float] = None,
    ):
        if (decay_iters is None) == (decay_ratio is None):
            raise ConfigError(
                'PRepBNScheduleHook needs exactly one of decay_iters (iterations) '
                f'and decay_ratio (fraction of training), got decay_iters='
                f'{decay_iters}, decay_ratio={decay_ratio}'
            )
        if warmup_iters < 0 or (decay_iters is not None and decay_iters < 0):
            raise ConfigError(
                f'warmup_iters and decay_iters must be >= 0, got {warmup_iters} and {decay_iters}'
            )
        if decay_ratio is not None and not 0.0 <= decay_ratio <= 1.0:
            raise ConfigError(f'decay_ratio must be in [0, 1], got {decay_ratio}')
        self.warmup_iters = warmup_iters
        self.decay_iters = decay_iters
        self.decay_ratio = decay_ratio
        self._layers: List[PRepBN] = []

    def before_train(self, runner) -> None:
        self._layers = [m for m in runner.model.modules() if isinstance(m, PRepBN)]
        if not self._layers:
            raise ConfigError(
                'PRepBNScheduleHook: the model has no PRepBN layer; use a backbone '
                "with PRepBN norms (type='PRepBNSwin') or remove the hook"
            )
        if self.decay_ratio is not None:
            self.decay_iters = round(self.decay_ratio * runner.max_iters)
        runner.logger.info(
            f'PRepBNScheduleHook: {len(self._layers)} PRepBN layers; lambda = 1 for '
            f'{self.warmup_iters} iterations, then 0 after {self.decay_iters} more '
            f'(training has {runner.max_iters})'
        )
        self._apply(runner)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._apply(runner)

    def _apply(self, runner) -> None:
        lam = prepbn_lambda(runner.iter, self.warmup_iters, self.decay_iters)
        for layer in self._layers:
            if layer.current_lambda != lam:
                layer.set_lambda(lam)
        runner.message_hub.update_scalar('train/prepbn_lambda', lam)
