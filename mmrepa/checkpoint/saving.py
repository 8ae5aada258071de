"""Writing checkpoints the tools produce: never over their input, never half-written. The
checks and the atomic write are :mod:`mmrepa.utils.files`'s, shared by every tool."""

import torch


def check_output_path(out: str, source: str, force: bool = False, tool: str = 'mmrepa') -> None:
    """Refuse ``out`` if it is the checkpoint ``source`` or a link to it, or exists and
    ``force`` is not set (:func:`mmrepa.utils.files.check_outputs` with one input)."""
    from ..utils.files import check_outputs  # mmrepa.utils imports more than `import mmrepa`

    check_outputs(tool, [('OUT', out)], [('checkpoint', source)], force=force)


def save_atomically(obj, path: str) -> None:
    """``torch.save(obj, path)`` through a temporary file in the same directory, renamed in
    one step: a crash, Ctrl-C or SIGTERM leaves the old file (or none) and no temporary, never
    a truncated file. The file gets the user's mode (umask), as ``torch.save`` to the path
    would give it."""
    from ..utils.files import atomic_output

    with atomic_output(path) as tmp:
        torch.save(obj, tmp)
