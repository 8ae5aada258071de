"""Writing the tools' outputs: in one step (never half a file), with the user's file mode.

A temporary file from :func:`tempfile.mkstemp` (a directory from :func:`tempfile.mkdtemp`) is
created with mode 0600 (0700) whatever the umask; renamed into place it would keep that mode,
unlike the files mmengine and ``open()`` write (0644 under the usual umask 022). Every output
written through a temporary file gets :func:`set_user_mode` before its rename.
"""
import contextlib
import os
import os.path as osp
import tempfile
from typing import Iterator


def current_umask() -> int:
    """The process's umask. Read from /proc where Linux shows it; elsewhere set and restored
    (``os.umask`` has no read-only form), which another thread could see for an instant."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def set_user_mode(path: str) -> None:
    """Give ``path`` the mode a new file (0666) or directory (0777) gets from the umask."""
    os.chmod(path, (0o777 if osp.isdir(path) else 0o666) & ~current_umask())


@contextlib.contextmanager
def atomic_output(path: str, suffix: str = '.tmp') -> Iterator[str]:
    """A temporary file path beside ``path`` to write to; when the block ends without an
    error it gets the user's file mode and replaces ``path`` in one step (atomic on one file
    system), otherwise it is removed and ``path`` is untouched. The directory is created."""
    out_dir = osp.dirname(osp.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f'.{osp.basename(path)}.', suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        set_user_mode(tmp)
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
