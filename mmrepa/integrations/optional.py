"""Optional dependencies of the tools: one rule, one message.

mmrepa itself needs torch, mmengine and mmcv. ONNX export and INT8 (onnx, onnxruntime), OpenVINO
and its INT8 (openvino, nncf), whole-model deployment (mmdeploy), plots (matplotlib) and timm's
checkpoint conversions (timm) are optional. The rule: a module that uses one
imports it where it is used, not at the top, through :func:`imported` (or checks it first with
:func:`require`), which raises :class:`~mmrepa.errors.DependencyError` naming the package and how
to install it; a tool parses its arguments first (``--help`` always works), then calls
:func:`require` for what the chosen options need, and prints the error as one line instead of a
traceback (:func:`mmrepa.integrations.cli.args.one_line_errors`).
"""

import importlib
from typing import Optional

from ..errors import DependencyError

# how to install each optional module (from the repository's root)
INSTALL = {
    'onnx': 'pip install -r requirements/tests.txt, or pip install onnx',
    'onnxruntime': 'pip install -r requirements/tests.txt, or pip install onnxruntime',
    'mmdeploy': 'make install-tests, or pip install --no-deps mmdeploy==1.3.1 and '
    'pip install -r requirements/deploy.txt (see that file)',
    'aenum': 'pip install -r requirements/deploy.txt',
    'openvino': "pip install -e '.[openvino]', or pip install -r requirements/openvino.txt",
    'nncf': "make install-tests, or pip install -e '.[openvino]'",
    'matplotlib': 'pip install matplotlib',
    'timm': "pip install -e '.[timm]', or pip install 'timm>=1.0'",
}


def missing(module: str) -> Optional[str]:
    """``None`` if ``module`` imports, else why not: 'needs X (how to install X)', or, when it is
    installed but one of its own imports fails, that error."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        if err.name in (None, module) or module.startswith(f'{err.name}.'):
            return f'needs {module} ({INSTALL.get(module.split(".")[0], f"pip install {module}")})'
        return f'{module} is installed but does not import: {err}'
    return None


def require(*modules: str, tool: str) -> None:
    """Import ``modules``; if one is missing, raise :class:`~mmrepa.errors.DependencyError`
    ``TOOL: needs MODULE (how to install it)``, one line per missing module (a tool exits with
    it, status 1)."""
    problems = [p for p in map(missing, modules) if p]
    if problems:
        raise DependencyError('\n'.join(f'{tool}: {p}' for p in problems))


def imported(module: str, user: str):
    """``module`` imported, for ``user`` (a module or tool name, for the message); raises
    :class:`~mmrepa.errors.DependencyError` if it is missing (see :func:`require`)."""
    require(module, tool=user)
    return importlib.import_module(module)
