from ..errors import CheckpointError, MissingKeysError
from .loading import (
    LoadReport,
    check_shapes,
    load_state_dict_checked,
    read_state_dict,
    strip_prefixes,
)
from .restricted_load import (
    ForeignGlobalError,
    RefusedCheckpointError,
    load_restricted,
    read_restricted,
)
from .safe_globals import allow_mmengine_checkpoints
from .saving import save_atomically
from .schemes import install_restricted_loader, load_checkpoint_file
from .stand_ins import ForeignConfig, ForeignNamespace
from .validation import check_checkpoint, check_state_dict, repeats_values

__all__ = [
    'LoadReport',
    'check_shapes',
    'load_state_dict_checked',
    'read_state_dict',
    'strip_prefixes',
    'allow_mmengine_checkpoints',
    'CheckpointError',
    'MissingKeysError',
    'ForeignConfig',
    'ForeignGlobalError',
    'ForeignNamespace',
    'RefusedCheckpointError',
    'install_restricted_loader',
    'load_checkpoint_file',
    'load_restricted',
    'read_restricted',
    'check_checkpoint',
    'check_state_dict',
    'repeats_values',
    'save_atomically',
]
