from ..errors import CheckpointError, MissingKeysError
from .loading import (LoadReport, check_shapes, load_state_dict_checked, read_state_dict,
                      strip_prefixes)
from .restricted_load import (ForeignConfig, ForeignGlobalError, ForeignNamespace,
                              install_restricted_loader, load_checkpoint_file)
from .safe_globals import allow_mmengine_checkpoints
from .saving import check_output_path, save_atomically

__all__ = [
    'LoadReport', 'check_shapes', 'load_state_dict_checked', 'read_state_dict', 'strip_prefixes',
    'allow_mmengine_checkpoints', 'CheckpointError', 'MissingKeysError', 'ForeignConfig',
    'ForeignGlobalError', 'ForeignNamespace', 'install_restricted_loader', 'load_checkpoint_file',
    'check_output_path', 'save_atomically'
]
