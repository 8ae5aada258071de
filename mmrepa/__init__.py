"""mmrepa: reparameterizable backbones for OpenMMLab detection and segmentation.

Importing mmrepa registers its backbones and hooks in mmengine's root registries (so
``type='RePaSwin'`` resolves from the mmdet, mmseg and mmpretrain scopes) and its layers in the
``mmrepa`` child registry (``type='mmrepa.PRepBN'`` from any scope, see :mod:`mmrepa.registry`).
It needs torch, mmengine and mmcv only. The one other change it makes in the process is its
safety net, the restricted checkpoint loader (torch's allow-list, mmengine's checkpoint
schemes), which ``MMREPA_RESTRICTED_LOAD=0`` turns off; the excepthook and the warnings filter
are for tools only (:mod:`mmrepa.one_line_errors` opts other projects' tools in). All of it is
listed, with why, in :mod:`mmrepa.seams`.
"""

from . import backbones, engine, layers, necks, seams  # noqa: F401  (importing registers)
from .checkpoint import allow_mmengine_checkpoints
from .fold import FoldError, FoldReport, fold_model, reparameterize
from .version import __version__

seams.install()  # the safety net only

__all__ = [
    '__version__',
    'reparameterize',
    'fold_model',
    'FoldReport',
    'FoldError',
    'allow_mmengine_checkpoints',
]
