"""The tools' output guard: an output never replaces an input.

:func:`check_outputs` runs first, before a tool builds anything: it refuses an output path
that is an input (the checkpoint, the config, an image, a data folder) or an existing file in an
input folder (an image of the test data), links to one (a symbolic link, or a hard link: the
same device and inode) or, for an output folder, holds one. The
message is one line naming the option, the output and the input. ``--force`` replaces an
existing output, never an input. The tool then writes through :mod:`mmrepa.utils.files`
(whole or not at all).
"""

import os
import os.path as osp
from typing import Iterable, List, NamedTuple, Optional, Tuple

from ...errors import InputError


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


def _inside_input(out: str, inputs: List[tuple]) -> Optional[Tuple[str, str]]:
    """(what, path) of an input folder the existing file ``out`` lies in (an image of the test
    data, a label map): replacing it would change the data."""
    real = osp.realpath(out)
    folders = [
        (len(r), what, path) for what, path, r, _ in inputs if osp.isdir(r) and _within(real, r)
    ]
    return max(folders)[1:] if folders else None  # the innermost: the image folder, not the root


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
            (files) or written into (folders, see :func:`mmrepa.utils.files.atomic_folder`).

    Raises :class:`~mmrepa.errors.InputError` (a tool exits with it, status 1:
    :func:`mmrepa.integrations.cli.args.one_line_errors`) with one line naming the option, the
    output and, if it is one, the input it would destroy: an output that is an input or a link
    to one, a folder that holds one (``--force`` does not help: inputs are never replaced); two
    outputs that are one path; a folder where a file goes or the other way round; an output under
    something that is not a folder; an existing output without ``force`` (if ``False``).
    Nothing is created: it only looks at the paths.
    """

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
        inside = _inside_input(out, inputs) if not folder and osp.lexists(out) else None
        if inside:
            raise InputError(
                f'{tool}: {option} {out} is a file of the input {inside[0]} {inside[1]}: an '
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


def guarded_config(
    tool: str,
    outputs: Iterable[tuple],
    config: str,
    checkpoint: Optional[str],
    cfg_options: Optional[dict] = None,
    force: Optional[bool] = None,
):
    """The config of a tool that reads CONFIG and CHECKPOINT: the outputs are checked against
    those two before the config is read, then against what the config reads (data, pretrained
    weights, RepOpt scales)."""
    from ...apis import load_config
    from ...config.inputs import config_inputs

    outputs = list(outputs)
    check_outputs(tool, outputs, [('config', config), ('checkpoint', checkpoint)], force)
    cfg = load_config(config, cfg_options)
    check_outputs(tool, outputs, config_inputs(cfg), force)
    return cfg
