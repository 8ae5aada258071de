"""A scalar in [0, 1] that a schedule hook sets from the runner's iteration (PRepBN's and the
joined layers' λ)."""

import torch

from ..options import check_unit_interval


class ScheduledScalar:
    """Mixin for an ``nn.Module`` with one scheduled scalar, held twice.

    - A float32 buffer named :attr:`scheduled_name` (its state-dict key): saved in
      checkpoints, restored on resume, moved with the module and copied by EMA.
    - A Python float, the exact value last set: the training forward branches on it without a
      device sync.

    Only :meth:`_set_scheduled` writes both (the hooks call it before every iteration); the
    forward never moves the value, so gradient checkpointing, accumulation and extra forward
    calls leave it alone. Loading a state dict copies the buffer to the host copy.
    """

    scheduled_name = 'value'  # a subclass names its buffer (kept: old checkpoints load)

    def _init_scheduled(self, value: float) -> None:
        self.register_buffer(self.scheduled_name, torch.tensor(0.0))
        self._set_scheduled(value)

    @property
    def scheduled_value(self) -> float:
        """The host copy: the value last set or loaded."""
        return self._scheduled_host

    def _set_scheduled(self, value: float) -> None:
        value = check_unit_interval(value, f'{type(self).__name__}: {self.scheduled_name}')
        self._scheduled_host = value
        with torch.no_grad():
            self._buffers[self.scheduled_name].fill_(value)

    def _scheduled_for_forward(self) -> float:
        """The host copy while training or tracing; the buffer in eval, because an EMA model
        receives the value by buffer copies that bypass :meth:`_set_scheduled`."""
        if self.training or torch.jit.is_tracing():
            return self._scheduled_host
        return float(self._buffers[self.scheduled_name])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        buffer = self._buffers.get(self.scheduled_name)
        if buffer is not None:  # None in a folded layer that has no schedule any more
            self._scheduled_host = float(buffer)
