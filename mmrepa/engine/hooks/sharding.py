"""What the hooks need to know about sharded (FSDP) training."""

from typing import Optional

import torch.nn as nn


def is_sharded(model: Optional[nn.Module]) -> bool:
    """An FSDP-wrapped model: its parameters are pieces, so a hook folds a gathered copy and
    runs the whole wrapper's forward (FSDP gathers a unit's weights in its own forward)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)
