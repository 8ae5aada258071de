"""Writing checkpoints the tools produce: never over their input, never half-written."""
import os.path as osp

import torch


def check_output_path(out: str, source: str, force: bool = False) -> None:
    """Refuse ``out`` if it is ``source`` itself, or exists and ``force`` is not set."""
    if osp.exists(out) and osp.samefile(out, source):
        raise SystemExit(f'OUT is the input checkpoint {source}; choose another path')
    if osp.exists(out) and not force:
        raise SystemExit(f'{out} exists; pass --force to replace it')


def save_atomically(obj, path: str) -> None:
    """``torch.save(obj, path)`` through a temporary file in the same directory, renamed in
    one step: a crash leaves the old file or none, never a truncated one. The file gets the
    user's mode (umask), as ``torch.save`` to the path would give it."""
    from ..utils.files import atomic_output  # mmrepa.utils imports more than `import mmrepa`
    with atomic_output(path) as tmp:
        torch.save(obj, tmp)
