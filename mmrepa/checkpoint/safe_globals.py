"""Let torch's ``weights_only`` loader (the default since torch 2.6) read mmengine checkpoints.

mmengine 0.10 checkpoints hold, besides tensors, the message hub's ``HistoryBuffer`` objects
with numpy arrays and scalars, and ``HistoryBuffer``'s statistics methods, which pickle writes
as ``getattr(HistoryBuffer, 'mean')``. We allow-list exactly those: the numpy types, the class,
and in place of ``getattr`` a function that only ever returns a ``HistoryBuffer`` statistics
method. The check itself stays on.
"""
import pickle

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer


def _numpy_globals():
    core = getattr(np, '_core', None) or np.core  # numpy 2 renamed np.core to np._core
    dtypes = [type(np.dtype(name)) for name in
              ('float16', 'float32', 'float64', 'int8', 'int16', 'int32', 'int64', 'uint8',
               'bool')]
    items = [np.ndarray, np.dtype, *dtypes]
    # A pickle names these by the module path of the numpy that wrote it: register both.
    for fn in (core.multiarray._reconstruct, core.multiarray.scalar):
        items += [(fn, f'numpy.core.multiarray.{fn.__name__}'),
                  (fn, f'numpy._core.multiarray.{fn.__name__}')]
    return items


def history_buffer_method(obj, name: str):
    """The only ``getattr`` a checkpoint may call: ``HistoryBuffer.<statistics method>``."""
    if obj is HistoryBuffer and (name in HistoryBuffer._statistics_methods
                                 or name in ('min', 'max', 'current', 'mean')):
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); mmrepa only allows the '
        'HistoryBuffer statistics methods that mmengine checkpoints contain')


def allow_mmengine_checkpoints() -> None:
    """Allow-list the non-tensor contents of mmengine checkpoints for ``torch.load``."""
    torch.serialization.add_safe_globals([
        HistoryBuffer,
        *_numpy_globals(),
        (history_buffer_method, '__builtin__.getattr'),  # protocol-2 pickles
        (history_buffer_method, 'builtins.getattr'),
    ])
