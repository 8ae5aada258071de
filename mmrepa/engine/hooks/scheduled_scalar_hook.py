"""The base of the hooks that set a scheduled scalar (a λ) of some layers from the runner's
iteration: PRepBN's normalization mix and the joined layers' branch join."""

import logging
from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from ...errors import ConfigError
from ...options import check_int, check_unit_interval


def check_iters_or_ratio(
    hook: str,
    iters_name: str,
    iters: Optional[int],
    ratio_name: str,
    ratio: Optional[float],
    required: bool,
) -> None:
    """One point of a schedule, given in iterations or as a fraction of ``runner.max_iters``:
    exactly one of the two if ``required``, else at most one; iterations an integer >= 0, the
    fraction in [0, 1]. The errors name ``hook`` and the options."""
    if required and iters is None and ratio is None:
        raise ConfigError(
            f'{hook} needs exactly one of {iters_name} (iterations) and {ratio_name} '
            f'(fraction of training), got {iters_name}={iters}, {ratio_name}={ratio}'
        )
    if iters is not None and ratio is not None:
        raise ConfigError(
            f'{hook} takes {"exactly" if required else "at most"} one of {iters_name} and '
            f'{ratio_name}, got {iters_name}={iters}, {ratio_name}={ratio}'
        )
    if iters is not None:
        check_int(iters, f'{hook}: {iters_name}', minimum=0)
    if ratio is not None:
        check_unit_interval(ratio, f'{hook}: {ratio_name}')


def iterations(iters: Optional[int], ratio: Optional[float], max_iters: int) -> int:
    """The iteration that ``iters`` or ``ratio`` (of ``max_iters``) names."""
    return iters if ratio is None else round(ratio * max_iters)


class ScheduledScalarHook(Hook):
    """Sets a scheduled scalar of some layers from ``runner.iter`` (0 for the first).

    In ``before_train`` and before every training iteration, on every rank, every layer that
    :meth:`find_layers` returns gets :meth:`value` of ``runner.iter``, which is logged as
    ``train/<scalar_name>``. The value depends on ``runner.iter`` only, so gradient
    accumulation, checkpointing, validation and other extra forward calls do not move it, and
    a resumed run continues the schedule exactly. A subclass checks its options in
    ``__init__`` (:func:`check_iters_or_ratio`) and implements the methods that raise
    ``NotImplementedError``.
    """

    priority = 'NORMAL'
    scalar_name = ''  # the logged name
    layer_kind = ''  # what find_layers looks for, for the error when there is none
    missing_hint = ''  # what to do then

    def find_layers(self, model: nn.Module) -> List[Tuple[str, nn.Module]]:
        """The (name, layer) pairs to set, from the unwrapped model."""
        raise NotImplementedError

    def resolve(self, runner) -> None:
        """Turn fractions of the training into iterations once ``runner.max_iters`` is known;
        refuse or warn about a schedule that cannot work with it."""
        raise NotImplementedError

    def describe(self) -> str:
        """The resolved schedule in a few words, for the log."""
        raise NotImplementedError

    def value(self, it: int) -> float:
        raise NotImplementedError

    def set_layer(self, layer: nn.Module, value: float) -> None:
        raise NotImplementedError

    @staticmethod
    def unwrap(runner) -> nn.Module:
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    def before_train(self, runner) -> None:
        self._layers = self.find_layers(self.unwrap(runner))
        if not self._layers:
            raise ConfigError(
                f'{type(self).__name__}: the model has no {self.layer_kind}; {self.missing_hint}'
            )
        self.resolve(runner)
        print_log(
            f'{type(self).__name__}: {len(self._layers)} {self.layer_kind}s; '
            f'{self.describe()} (training has {runner.max_iters})',
            logger=runner.logger,
            level=logging.INFO,
        )
        self._apply(runner)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._apply(runner)

    def _apply(self, runner) -> None:
        value = self.value(runner.iter)
        for _, layer in self._layers:
            self.set_layer(layer, value)
        runner.message_hub.update_scalar(f'train/{self.scalar_name}', value)
