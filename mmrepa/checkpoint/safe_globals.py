"""Let torch's ``weights_only`` loader (the default since torch 2.6) read mmengine checkpoints.

mmengine 0.10 checkpoints hold, besides tensors, the message hub's ``HistoryBuffer`` objects and
numpy arrays and scalars. We allow-list exactly those types instead of switching the check off.
"""
import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer


def _numpy_types():
    core = getattr(np, '_core', None) or np.core  # numpy 2 renamed np.core to np._core
    multiarray = core.multiarray
    dtypes = [type(np.dtype(name)) for name in
              ('float16', 'float32', 'float64', 'int8', 'int16', 'int32', 'int64', 'uint8',
               'bool')]
    items = [np.ndarray, np.dtype, *dtypes]
    # Pickles name these by the module path of the numpy that wrote them: register both.
    for fn in (multiarray._reconstruct, multiarray.scalar):
        items += [(fn, f'numpy.core.multiarray.{fn.__name__}'),
                  (fn, f'numpy._core.multiarray.{fn.__name__}')]
    return items


def allow_mmengine_checkpoints() -> None:
    """Allow-list the non-tensor types of mmengine checkpoints for ``torch.load``."""
    torch.serialization.add_safe_globals([HistoryBuffer, *_numpy_types()])
