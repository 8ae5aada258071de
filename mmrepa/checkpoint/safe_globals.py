"""Let torch's ``weights_only`` loader (the default since torch 2.6) read mmengine checkpoints.

mmengine 0.10 checkpoints hold, besides tensors, the message hub's ``HistoryBuffer`` objects with
numpy arrays and scalars, and ``HistoryBuffer``'s statistics methods, which pickle writes as
``getattr(HistoryBuffer, 'mean')``. :func:`allow_mmengine_checkpoints` registers, under exactly
those names, the inert stand-ins of :mod:`.stand_ins` (never the real classes and functions,
whose code would run with the file's data), so that a plain ``torch.load`` of an mmengine
checkpoint works after ``import mmrepa``. The check itself stays on: anything else is refused.
"""

import torch

from .stand_ins import MMENGINE_GLOBALS


def allow_mmengine_checkpoints() -> None:
    """Register the mmengine stand-ins with ``torch.serialization.add_safe_globals``
    (idempotent; ``import mmrepa`` calls it)."""
    torch.serialization.add_safe_globals(list(MMENGINE_GLOBALS))
