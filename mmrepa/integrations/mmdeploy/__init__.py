"""mmrepa's rewrites for mmdeploy: ``import mmrepa.integrations.mmdeploy`` before exporting an
mmrepa model with mmdeploy (the deploy configs in ``configs/deploy/`` import it through
``custom_imports``; ``tools/deploy.py`` imports it). Needs mmdeploy; ``import mmrepa`` never
imports this."""

try:
    import mmdeploy  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'mmrepa.integrations.mmdeploy needs mmdeploy 1.3.1: bash tools/install_deps.sh PYTHON '
        '--tests installs it (pip install --no-deps mmdeploy==1.3.1 aenum; see '
        'requirements/deploy.txt)'
    ) from err

from . import mmdet_heads, rewriters  # noqa: E402,F401
from .rewriters import SDPA_METHODS, exact_sdpa  # noqa: E402

__all__ = ['SDPA_METHODS', 'exact_sdpa']
