"""Everything ``import mmrepa`` changes outside mmrepa's own modules, in one place.

Importing mmrepa's modules registers their types in mmengine's registries (that is how configs
find them; see :mod:`mmrepa.registry`). Beyond that, :func:`install` (called once by
``mmrepa/__init__.py``) makes exactly these process-wide changes, each through the public API
of the package it changes; nothing else in mmrepa patches another package:

0. **a warnings filter**: mmengine 0.10 imports ``pkg_resources`` to find the installed
   mmdet / mmseg / mmpretrain (the configs' ``mmdet::`` bases); with setuptools >= 77 (which
   torch needs) that import warns twice, in every tool. Nothing to act on until mmengine moves
   off ``pkg_resources`` (setuptools < 81 still ships it, requirements/stack.txt pins that):
   only this one warning is silenced, before anything imports mmengine.
1. **torch's allow-list** (``torch.serialization.add_safe_globals``): inert stand-ins for what
   mmengine checkpoints hold besides tensors, so that a plain ``torch.load`` of one works
   (:func:`mmrepa.checkpoint.allow_mmengine_checkpoints`).
2. **mmengine's checkpoint schemes** (``CheckpointLoader.register_scheme``): every scheme
   (local, http, ``open-mmlab://``, ``torchvision://``, ...) reads through mmrepa's restricted
   loader, so ``load_from``, ``init_cfg`` and resume never run a file's code
   (:func:`mmrepa.checkpoint.install_restricted_loader`).
3. **sys.excepthook**: an uncaught error whose cause is known (an mmrepa error, an
   unregistered type, a missing data file inside a Runner) prints as one line instead of a
   traceback. It stays on import on purpose: mmdet's, mmseg's and mmpretrain's own tools
   (``mim train mmdet CONFIG``) import mmrepa only through the config's ``custom_imports``, so
   this is the one way our errors reach their users in one line (our own tools catch them
   first, :func:`mmrepa.integrations.cli.args.one_line_errors`). A hook someone else installed
   (IPython, a debugger) is left alone; ``MMREPA_TRACEBACK=1`` shows the traceback; errors it
   does not know go to the previous hook unchanged.

The excepthook imports the checks that explain an error only when one is uncaught, so
``import mmrepa`` imports nothing of :mod:`mmrepa.integrations`.
"""

import os
import sys
import warnings


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
    """Print the errors :func:`mmrepa.config.checks.explain` knows as one line
    instead of a traceback (see the module's docstring, item 3)."""
    if sys.excepthook is sys.__excepthook__:
        previous = sys.excepthook
        sys.excepthook = lambda kind, err, tb: _excepthook(kind, err, tb, previous)


def install() -> None:
    """Make the changes listed in the module's docstring (idempotent)."""
    warnings.filterwarnings(
        'ignore', message='pkg_resources is deprecated as an API', category=UserWarning
    )
    from .checkpoint import allow_mmengine_checkpoints, install_restricted_loader

    allow_mmengine_checkpoints()
    install_restricted_loader()
    install_excepthook()
