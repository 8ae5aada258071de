"""Writing files and folders in one step (never half a file), with the user's file mode: every
tool's output and every checkpoint mmrepa saves goes through this module. (Which paths a tool
may write is :mod:`mmrepa.integrations.cli.outputs`' business.)

:func:`atomic_output` (a file) and :func:`atomic_folder` (a folder) write through a
temporary file or folder beside the target, renamed into place at the end: an error, Ctrl-C
(``KeyboardInterrupt``) or SIGTERM / SIGHUP (which end the process only after the ``finally``
clauses ran: :func:`clean_up_on_termination`) leaves the old output as it was and no temporary
behind, and the folders created for the output are removed again. Only SIGKILL, which no
process can catch, may leave a temporary (named ``.NAME.*``) beside an intact old output.

A temporary file from :func:`tempfile.mkstemp` (a directory from :func:`tempfile.mkdtemp`) is
created with mode 0600 (0700) whatever the umask; renamed into place it would keep that mode,
unlike the files mmengine and ``open()`` write (0644 under the usual umask 022). Every output
written through a temporary gets :func:`set_user_mode` before its rename.
"""

import contextlib
import json
import os
import os.path as osp
import shutil
import signal
import tempfile
import threading
from typing import Iterator, List, Optional


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


# ------------------------------------------------------------ writing: whole or not at all


class _Terminated(BaseException):
    """A SIGTERM / SIGHUP on its way through the ``finally`` blocks of a write (a
    ``BaseException``: no ``except Exception`` stops it)."""


@contextlib.contextmanager
def clean_up_on_termination() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP unwind the block (its ``finally`` clauses remove what is half
    written) and then end the process by the same signal, as if it had come after the
    clean-up: the exit status is the one the signal gives (a shell shows 143 for SIGTERM), and
    the library decides no exit of its own. Ctrl-C raises ``KeyboardInterrupt`` anyway. Only
    signals left at their default are taken over, in the main thread only (where Python runs
    signal handlers); the handlers are restored on exit. A second signal while the first one
    unwinds is ignored, not to interrupt the clean-up; whatever error the first one became on
    its way out (torch.save turns it into a RuntimeError), the process ends by the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:
            raised.append(signum)
            raise _Terminated(signum)

    previous = {}
    for name in ('SIGTERM', 'SIGHUP'):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        if raised:  # the default action, now that the block has cleaned up
            signal.raise_signal(raised[0])


def _missing_folders(folder: str) -> List[str]:
    """``folder`` and those of its ancestors that do not exist yet, deepest first."""
    missing = []
    while not osp.exists(folder) and osp.dirname(folder) != folder:
        missing.append(folder)
        folder = osp.dirname(folder)
    return missing


def _remove_if_empty(folders: List[str]) -> None:
    for folder in folders:  # deepest first
        with contextlib.suppress(OSError):
            os.rmdir(folder)


@contextlib.contextmanager
def atomic_output(path: str, suffix: Optional[str] = None) -> Iterator[str]:
    """A temporary file path beside ``path`` to write to; when the block ends without an
    error it gets the user's file mode and replaces ``path`` in one step (atomic on one file
    system), otherwise (an exception, Ctrl-C, SIGTERM: see :func:`clean_up_on_termination`) it is
    removed, ``path`` is untouched and the folders created for it are removed again. The
    temporary is ``.NAME.XXXX.tmp.EXT`` (``suffix`` replaces ``.tmp.EXT``): writers that pick
    the format from the extension (matplotlib, cv2, mmengine's ``dump``) see the target's."""
    name = osp.basename(path)
    if suffix is None:
        suffix = '.tmp' + osp.splitext(name)[1]
    with clean_up_on_termination():
        out_dir = osp.dirname(osp.abspath(path))
        created, tmp, published = _missing_folders(out_dir), None, False
        try:
            os.makedirs(out_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f'.{name}.', suffix=suffix)
            os.close(fd)
            yield tmp
            set_user_mode(tmp)
            os.replace(tmp, path)
            published = True
        finally:
            if tmp and not published:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
            if not published:
                _remove_if_empty(created)


def _replace_folder(tmp: str, out: str) -> None:
    """Move the finished ``tmp`` to ``out``; an old ``out`` is moved aside first and removed
    after (the guard checked it holds no input)."""
    old = None
    if osp.lexists(out):
        old = tempfile.mkdtemp(dir=osp.dirname(osp.abspath(out)), prefix='.old-')
        os.rename(out, osp.join(old, 'out'))
    os.rename(tmp, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _merge_folder(tmp: str, out: str) -> None:
    """Move every file of ``tmp`` to the same place under the existing folder ``out``, each in
    one step (a file of the same name is replaced, the others are kept)."""
    for root, _, files in os.walk(tmp):
        target = osp.normpath(osp.join(out, osp.relpath(root, tmp)))
        os.makedirs(target, exist_ok=True)
        for name in files:
            os.replace(osp.join(root, name), osp.join(target, name))


@contextlib.contextmanager
def atomic_folder(path: str, replace: bool = True) -> Iterator[str]:
    """A temporary folder beside ``path`` to write the output folder's files in; when the block
    ends without an error it gets the user's mode and becomes ``path``: ``replace``: in one
    rename, an existing ``path`` replaced whole (a tool's ``--force``); else, if ``path``
    exists, its files are moved in one by one, the files already there kept (as a
    visualization hook writes into its folder). On an error, Ctrl-C or SIGTERM the temporary
    folder and the folders created for it are removed, ``path`` is untouched."""
    with clean_up_on_termination():
        parent = osp.dirname(osp.abspath(path))
        created, tmp, published = _missing_folders(parent), None, False
        try:
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(dir=parent, prefix=f'.{osp.basename(osp.abspath(path))}.tmp-')
            yield tmp
            set_user_mode(tmp)  # mkdtemp's 0700, as os.makedirs would have made it
            if replace or not osp.isdir(path):
                _replace_folder(tmp, path)
            else:
                _merge_folder(tmp, path)
            published = True
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
            if not published:
                _remove_if_empty(created)


def write_json(obj, path: str, **kwargs) -> None:
    """``obj`` as JSON (indented by 2) at ``path``, through :func:`atomic_output`."""
    with atomic_output(path) as tmp, open(tmp, 'w') as f:
        json.dump(obj, f, indent=2, **kwargs)
