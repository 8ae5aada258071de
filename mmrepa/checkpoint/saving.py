"""Writing checkpoints: never half-written (the atomic write of :mod:`mmrepa.utils.files`,
shared by every tool; which paths a tool may write is checked by
:mod:`mmrepa.integrations.cli.outputs`)."""

import torch


def save_atomically(obj, path: str) -> None:
    """``torch.save(obj, path)`` through a temporary file in the same directory, renamed in
    one step: a crash, Ctrl-C or SIGTERM leaves the old file (or none) and no temporary, never
    a truncated file. The file gets the user's mode (umask), as ``torch.save`` to the path
    would give it."""
    from ..utils.files import atomic_output

    with atomic_output(path) as tmp:
        torch.save(obj, tmp)
