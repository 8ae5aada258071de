"""mmrepa: reparameterizable backbones for OpenMMLab detection and segmentation.

Importing mmrepa registers its backbones and hooks in mmengine's root registries (so
``type='RePaSwin'`` resolves from the mmdet, mmseg and mmpretrain scopes), its layers in the
``mmrepa`` child registry (``type='mmrepa.PRepBN'`` from any scope, see :mod:`mmrepa.registry`),
and lets torch's ``weights_only`` loader read mmengine checkpoints. It needs torch, mmengine and
mmcv only.
"""

import warnings

# mmengine 0.10 imports pkg_resources to find the installed mmdet / mmseg / mmpretrain (the
# configs' `mmdet::` bases); with setuptools >= 77 (which torch needs) that import warns twice,
# in every tool. Nothing to act on until mmengine moves off pkg_resources (setuptools < 81 still
# ships it, requirements/stack.txt pins that): only this one warning is silenced.
warnings.filterwarnings(
    'ignore', message='pkg_resources is deprecated as an API', category=UserWarning
)

from . import backbones, engine, layers, necks  # noqa: F401,E402  (importing registers)
from .checkpoint import allow_mmengine_checkpoints, install_restricted_loader  # noqa: E402
from .fold import FoldError, FoldReport, fold_model, reparameterize  # noqa: E402
from .integrations.cli.config_checks import install_excepthook  # noqa: E402
from .version import __version__  # noqa: E402

allow_mmengine_checkpoints()
install_restricted_loader()
install_excepthook()  # mmdet's own tools: our errors as one line, not a traceback

__all__ = [
    '__version__',
    'reparameterize',
    'fold_model',
    'FoldReport',
    'FoldError',
    'allow_mmengine_checkpoints',
]
