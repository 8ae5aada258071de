"""mmrepa's rewrites for mmdeploy: ``import mmrepa.integrations.mmdeploy`` before exporting an
mmrepa model with mmdeploy (the deploy configs in ``configs/deploy/`` import it through
``custom_imports``; ``tools/deploy.py`` imports it). Needs mmdeploy; ``import mmrepa`` never
imports this."""

from ..optional import require

# one line naming the install, not a traceback
require('mmdeploy', tool='mmrepa.integrations.mmdeploy')

from . import mmdet_heads, openvino, rewriters  # noqa: E402,F401
from .rewriters import SDPA_METHODS, exact_sdpa  # noqa: E402

__all__ = ['SDPA_METHODS', 'exact_sdpa']
