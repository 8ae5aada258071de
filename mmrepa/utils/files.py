"""Writing the tools' outputs: never over an input, in one step (never half a file), with the
user's file mode. Every tool that writes a file or a folder goes through this module.

:func:`check_outputs` runs first, before the tool builds anything: it refuses an output path
that is an input (the checkpoint, the config, an image, a data folder), links to one (a symbolic
link, or a hard link: the same device and inode) or, for an output folder, holds one. The
message is one line naming the option, the output and the input. ``--force`` replaces an
existing output, never an input.

:func:`atomic_output` (a file) and :func:`atomic_folder` (a folder) then write through a
temporary file or folder beside the target, renamed into place at the end: an error, Ctrl-C
(``KeyboardInterrupt``) or SIGTERM / SIGHUP (turned into ``SystemExit(128 + signal)`` for the
write's duration, so that ``finally`` runs) leaves the old output as it was and no temporary
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
from typing import Iterable, Iterator, List, NamedTuple, Optional, Tuple


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


# ------------------------------------------------------------------ the guard: inputs stay


class Output(NamedTuple):
    """A path a tool writes: ``option`` is how the command line names it (``'--out'``,
    ``'OUT'``); ``folder``: the tool writes a folder there."""

    option: str
    path: Optional[str]
    folder: bool = False


def _file_id(path: str, follow: bool = True) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:  # missing, a dangling link, unreadable
        return None
    return st.st_dev, st.st_ino


def _within(path: str, folder: str) -> bool:
    """Whether the resolved ``path`` lies inside the resolved ``folder`` (not equal to it)."""
    return path != folder and path.startswith(folder.rstrip(os.sep) + os.sep)


def _same_file(out: str, inp: str, inp_id) -> Optional[str]:
    """How ``out`` is the input ``inp`` ('is', 'is a symbolic link to', 'is a hard link to'),
    or None if it is another file."""
    if inp_id is None or not osp.lexists(out) or _file_id(out) != inp_id:
        return None
    if osp.realpath(out) == osp.realpath(inp):
        return 'is a symbolic link to' if osp.islink(out) else 'is'
    return 'is a hard link to'


def _held_input(folder: str, inputs: List[tuple]) -> Optional[Tuple[str, str, str]]:
    """(what, path, how) of an input inside ``folder``: under it once links are resolved, or
    a hard link to an input file anywhere in it (symbolic links in it are not followed:
    replacing or removing a link leaves its target alone)."""
    real = osp.realpath(folder)
    for what, path, resolved, _ in inputs:
        if _within(resolved, real):
            return what, path, 'holds'
    ids = {
        file_id: (what, path)
        for what, path, _, file_id in inputs
        if file_id is not None and osp.isfile(path)
    }
    if ids and osp.isdir(folder):
        for root, _, files in os.walk(folder):
            for name in files:
                found = ids.get(_file_id(osp.join(root, name), follow=False))
                if found:
                    return (*found, f'holds a hard link ({osp.join(root, name)}) to')
    return None


def _first_existing(folder: str) -> str:
    while not osp.exists(folder) and osp.dirname(folder) != folder:
        folder = osp.dirname(folder)
    return folder


def check_outputs(
    tool: str, outputs: Iterable[tuple], inputs: Iterable[tuple], force: Optional[bool] = None
) -> None:
    """Refuse, with one line, outputs that would destroy an input or cannot be written.

    Args:
        tool: how the messages start, e.g. ``'tools/reparameterize.py'``.
        outputs: :class:`Output` (or ``(option, path[, folder])``) of every path the tool will
            write; ``None`` paths are skipped.
        inputs: ``(what, path)`` of every file or folder the tool reads (``'checkpoint'``,
            ``'config'``, ``'test image directory'``, ...); ``None``, missing and remote
            (``scheme://``) paths are skipped.
        force: the tool's ``--force``: ``False`` refuses an existing output, ``True`` lets it
            be replaced; ``None`` for tools without ``--force``, whose outputs are replaced
            (files) or written into (folders, see :func:`atomic_folder`).

    Raises :class:`~mmrepa.errors.InputError` (a tool exits with it, status 1:
    :func:`mmrepa.apis.one_line_errors`) with one line naming the option, the output and, if
    it is one, the input it would destroy: an output that is an input or a link to one, a
    folder that holds one (``--force`` does not help: inputs are never replaced); two outputs
    that are one path; a folder where a file goes or the other way round; an output under
    something that is not a folder; an existing output without ``force`` (if ``False``).
    Nothing is created: it only looks at the paths.
    """
    from ..errors import InputError  # here: the module loads alone, without mmrepa's imports

    outputs = [Output(*o) for o in outputs if o[1]]
    inputs = [
        (what, path, osp.realpath(path), _file_id(path))
        for what, path in inputs
        if path and '://' not in path and osp.exists(path)
    ]
    never = ', even with --force' if force is not None else ''
    seen = {}
    for option, out, folder in outputs:
        for what, path, _, file_id in inputs:
            how = _same_file(out, path, file_id)
            if how:
                raise InputError(
                    f'{tool}: {option} {out} {how} the input {what} {path}: an '
                    f'output never replaces an input{never}; write it elsewhere'
                )
        held = _held_input(out, inputs) if osp.isdir(out) else None
        if held:
            what, path, how = held
            raise InputError(
                f'{tool}: {option} {out} {how} the input {what} {path}: an output '
                f'folder never holds an input{never}; choose another folder'
            )
        real = osp.realpath(out)
        if real in seen:
            raise InputError(
                f'{tool}: {seen[real]} and {option} are both {out}; give each output its own path'
            )
        seen[real] = option
        if osp.exists(out) and osp.isdir(out) != folder:
            raise InputError(
                f'{tool}: {option} {out} is a {"file" if folder else "folder"}; '
                f'name a {"folder" if folder else "file"}'
            )
        parent = _first_existing(osp.dirname(osp.abspath(out)))
        if not osp.isdir(parent):
            raise InputError(
                f'{tool}: {option} {out}: {parent} is a file, not a folder; write it elsewhere'
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(
                f'{tool}: {option} {out}: cannot write in {parent} (permission '
                'denied); write it elsewhere'
            )
        if force is False and osp.lexists(out):
            raise InputError(f'{tool}: {option} {out} exists; pass --force to replace it')


# ------------------------------------------------------------ writing: whole or not at all


@contextlib.contextmanager
def raise_on_termination() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` (the exit status a shell
    reports for a process they ended) instead of ending the process at once, so that
    ``finally`` blocks remove what is half written; Ctrl-C raises ``KeyboardInterrupt``
    anyway. Only signals left at their default are taken over, in the main thread only (where
    Python runs signal handlers); the handlers are restored on exit. A second signal while the
    first one unwinds is ignored, not to interrupt the clean-up; whatever error the first one
    became on its way out (torch.save turns it into a RuntimeError) leaves as that
    ``SystemExit``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = []

    def handler(signum, frame):
        if not raised:
            raised.append(signum)
            raise SystemExit(128 + signum)

    previous = {}
    for name in ('SIGTERM', 'SIGHUP'):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    except BaseException:
        if raised:  # a library may turn it into its own error on the way out (torch.save does)
            raise SystemExit(128 + raised[0]) from None
        raise
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


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
    system), otherwise (an exception, Ctrl-C, SIGTERM: see :func:`raise_on_termination`) it is
    removed, ``path`` is untouched and the folders created for it are removed again. The
    temporary is ``.NAME.XXXX.tmp.EXT`` (``suffix`` replaces ``.tmp.EXT``): writers that pick
    the format from the extension (matplotlib, cv2, mmengine's ``dump``) see the target's."""
    name = osp.basename(path)
    if suffix is None:
        suffix = '.tmp' + osp.splitext(name)[1]
    with raise_on_termination():
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
    with raise_on_termination():
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
