"""mmrepa: reparameterizable backbones for OpenMMLab detection and segmentation.

Importing mmrepa registers its backbones and hooks in mmengine's root registries (so
``type='RePaSwin'`` resolves from the mmdet, mmseg and mmpretrain scopes) and its layers in the
``mmrepa`` child registry (``type='mmrepa.PRepBN'`` from any scope, see :mod:`mmrepa.registry`).
It needs torch, mmengine and mmcv only. Everything else it changes in the process (a warnings
filter, torch's allow-list, mmengine's checkpoint schemes, the excepthook) is listed, with why,
in :mod:`mmrepa.seams`.
"""

from . import seams

seams.install()  # first: its warnings filter must precede the imports of mmengine

from . import backbones, engine, layers, necks  # noqa: E402,F401  (importing registers)
from .checkpoint import allow_mmengine_checkpoints  # noqa: E402
from .fold import FoldError, FoldReport, fold_model, reparameterize  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    '__version__',
    'reparameterize',
    'fold_model',
    'FoldReport',
    'FoldError',
    'allow_mmengine_checkpoints',
]
