from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.registry import HOOKS

from ...layers import PRepBN
from ...options import check_int
from .scheduled_scalar_hook import ScheduledScalarHook, check_iters_or_ratio, iterations


def prepbn_lambda(it: int, warmup_iters: int, decay_iters: int) -> float:
    """λ at iteration ``it``: 1 for ``warmup_iters``, then linear to 0 over ``decay_iters``."""
    if it < warmup_iters:
        return 1.0
    if decay_iters <= 0:
        return 0.0
    return max(0.0, 1.0 - (it - warmup_iters) / decay_iters)


@HOOKS.register_module()
class PRepBNScheduleHook(ScheduledScalarHook):
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

    scalar_name = 'prepbn_lambda'
    layer_kind = 'PRepBN layer'
    missing_hint = (
        "use a backbone with PRepBN norms (type='PRepBNSwin', 'PRepBNViT' or 'PRepBNPVT') "
        'or remove the hook'
    )

    def __init__(
        self,
        warmup_iters: int = 0,
        decay_iters: Optional[int] = None,
        decay_ratio: Optional[float] = None,
    ):
        check_int(warmup_iters, 'PRepBNScheduleHook: warmup_iters', minimum=0)
        check_iters_or_ratio(
            'PRepBNScheduleHook', 'decay_iters', decay_iters, 'decay_ratio', decay_ratio, True
        )
        self.warmup_iters = warmup_iters
        self.decay_iters = decay_iters
        self.decay_ratio = decay_ratio

    def find_layers(self, model: nn.Module) -> List[Tuple[str, nn.Module]]:
        return [(name, m) for name, m in model.named_modules() if isinstance(m, PRepBN)]

    def resolve(self, runner) -> None:
        self.decay_iters = iterations(self.decay_iters, self.decay_ratio, runner.max_iters)

    def describe(self) -> str:
        return (
            f'lambda = 1 for {self.warmup_iters} iterations, then 0 after {self.decay_iters} more'
        )

    def value(self, it: int) -> float:
        return prepbn_lambda(it, self.warmup_iters, self.decay_iters)

    def set_layer(self, layer: nn.Module, value: float) -> None:
        layer.set_lambda(value)
