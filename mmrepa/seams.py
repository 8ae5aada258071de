"""Everything mmrepa changes outside its own modules, in one place, and who turns each on.

Importing mmrepa's modules registers their types in mmengine's registries (that is how configs
find them; see :mod:`mmrepa.registry`). Beyond that, ``import mmrepa`` makes only the changes of
its **safety net**, the restricted checkpoint loader (:func:`install`, docs/integration.md,
"Checkpoints and weights_only" and "Release checkpoints, safely"), each through the public API
of the package it changes; nothing else in mmrepa patches another package:

1. **torch's allow-list** (``torch.serialization.add_safe_globals``): inert stand-ins for what
   mmengine checkpoints hold besides tensors, so that a plain ``torch.load`` of one works
   (:func:`mmrepa.checkpoint.allow_mmengine_checkpoints`).
2. **mmengine's checkpoint schemes** (``CheckpointLoader.register_scheme``): every scheme
   (local, http, ``open-mmlab://``, ``torchvision://``, ...) reads through mmrepa's restricted
   loader, so ``load_from``, ``init_cfg`` and resume never run a file's code
   (:func:`mmrepa.checkpoint.install_restricted_loader`).

``MMREPA_RESTRICTED_LOAD=0`` in the environment before ``import mmrepa`` turns both off: torch's
allow-list and mmengine's schemes stay as they were (mmrepa's own reader,
:func:`mmrepa.checkpoint.load_checkpoint_file`, still reads restricted, with the allow-list for
one load only).

Two more changes are for a tool's process only, never made by ``import mmrepa``
(:func:`install_tool_seams`): mmrepa's tools make them (:mod:`mmrepa.integrations.cli`), and
so does the opt-in of mmdet's, mmseg's and mmpretrain's tools, one config line
(:mod:`mmrepa.one_line_errors`, docs/troubleshooting.md):

3. **a warnings filter**: mmengine 0.10 imports ``pkg_resources`` to find the installed
   mmdet / mmseg / mmpretrain (the configs' ``mmdet::`` bases); with setuptools >= 77 (which
   torch needs) that import warns twice, in every tool that reads a config. Nothing to act on
   until mmengine moves off ``pkg_resources``: only this one warning is silenced.
4. **sys.excepthook**: an uncaught error whose cause is known (an mmrepa error, an
   unregistered type, a missing data file inside a Runner) prints as one line instead of a
   traceback (:func:`mmrepa.config.explain.explain`; our own tools catch mmrepa's errors
   first, :func:`mmrepa.integrations.cli.args.one_line_errors`). A hook someone else installed
   (IPython, a debugger) is left alone; ``MMREPA_TRACEBACK=1`` shows the traceback; errors it
   does not know go to the previous hook unchanged.

The excepthook imports the checks that explain an error only when one is uncaught.
"""

import os
import sys
import warnings

SWITCH = 'MMREPA_RESTRICTED_LOAD'  # '0': import mmrepa leaves torch and mmengine as they are


def restricted_load_on() -> bool:
    """Whether ``import mmrepa`` installs its safety net (:data:`SWITCH` is not ``'0'``)."""
    return os.environ.get(SWITCH, '1').strip() != '0'


def install() -> None:
    """What ``import mmrepa`` changes: the safety net, items 1 and 2 of the module's docstring,
    unless :data:`SWITCH` is ``'0'`` (idempotent)."""
    if not restricted_load_on():
        return
    from .checkpoint import allow_mmengine_checkpoints, install_restricted_loader

    allow_mmengine_checkpoints()
    install_restricted_loader()


def _excepthook(kind, err, tb, previous) -> None:
    line = None
    if not os.environ.get('MMREPA_TRACEBACK'):
        try:
            from .config.explain import TRACEBACK_HINT, explain

            line = explain(err, tb)
        except Exception:  # noqa: BLE001  never hide the real error behind one of ours
            line = None
    if line is None:
        previous(kind, err, tb)
    else:
        sys.stderr.write(f'{line}\n{TRACEBACK_HINT}\n')


def install_excepthook() -> None:
    """Print the errors :func:`mmrepa.config.explain.explain` knows as one line instead of a
    traceback (see the module's docstring, item 4)."""
    if sys.excepthook is sys.__excepthook__:
        previous = sys.excepthook
        sys.excepthook = lambda kind, err, tb: _excepthook(kind, err, tb, previous)


def install_tool_seams() -> None:
    """A tool process's changes, items 3 and 4 of the module's docstring (idempotent)."""
    warnings.filterwarnings(
        'ignore', message='pkg_resources is deprecated as an API', category=UserWarning
    )
    install_excepthook()
