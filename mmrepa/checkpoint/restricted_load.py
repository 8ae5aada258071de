"""Reading checkpoints without running their code: torch's ``weights_only`` unpickler with
mmrepa's stand-ins, then the checks of :mod:`.validation`.

torch's ``weights_only`` loader (the default since torch 2.6) builds tensors, containers,
numbers and strings, and any other object only from its allow-list of globals. The release
checkpoints of RePaViT and timm's ``train.py`` (an ``argparse.Namespace`` under ``args``), of
SLAB and Microsoft Swin (a yacs ``CfgNode`` under ``config``) and mmengine's (message-hub
``HistoryBuffer``s, numpy arrays and scalars) need more; :mod:`.stand_ins` provides inert
stand-ins under those names. :func:`read_restricted` is the one place in mmrepa, its tools and
benchmarks that deserializes a file: every scheme of :mod:`.schemes` downloads, then calls it
through :func:`load_restricted` (which checks a checkpoint); data files (token-label maps) are
read by it directly.

During a load the allow-list is torch's own plus exactly our stand-ins: the foreign ones are
added for the load only (a plain ``torch.load`` elsewhere in the process keeps refusing a
Namespace), and anything else registered under one of our names is set aside meanwhile (torch
would pick one of two entries for a name at random).
"""

import contextlib
import os
import pickle
import re
import threading
from typing import Any, Iterator, Optional

import torch

from ..errors import CheckpointError
from .stand_ins import FOREIGN_GLOBALS, MMENGINE_GLOBALS, collect_config_nodes, finish
from .validation import check_checkpoint

OUR_GLOBALS = MMENGINE_GLOBALS + FOREIGN_GLOBALS
_OUR_NAMES = {name for _, name in OUR_GLOBALS}
_LOCK = threading.RLock()  # torch's safe-globals list is one per process

READS = (
    'tensors, containers, numbers, strings, numpy data and mmengine records, and rebuilds '
    'argparse.Namespace, yacs.config.CfgNode and easydict.EasyDict as plain data'
)
TRUSTED_WAY = (
    'If you trust the file, load it once with torch.load(weights_only=False) and save '
    "the weights alone: torch.save(ckpt['model'], 'weights.pth')"
)


class RefusedCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The file asks for something the restricted loader does not do."""


class ForeignGlobalError(RefusedCheckpointError):
    """The file asks for a global that is not on the allow-list."""


def _entry_name(entry: Any) -> str:
    """The name torch matches a safe-globals entry under."""
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


def _replace_safe_globals(entries: list) -> None:
    """torch's allow-list becomes ``entries`` (public API only: torch has no public removal)."""
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(entries)


@contextlib.contextmanager
def our_allow_list() -> Iterator[None]:
    """torch's safe globals for one load: ours under our names, others' untouched (what
    another thread registers meanwhile is kept)."""
    with _LOCK:
        registered = torch.serialization.get_safe_globals()
        aside = [g for g in registered if _entry_name(g) in _OUR_NAMES and g not in OUR_GLOBALS]
        added = [g for g in OUR_GLOBALS if g not in registered]
        _replace_safe_globals([g for g in registered if g not in aside] + added)
        try:
            yield
        finally:
            now = torch.serialization.get_safe_globals()
            _replace_safe_globals([g for g in now if g not in added] + aside)


def _refusal(name: str, err: pickle.UnpicklingError) -> RefusedCheckpointError:
    """torch's several-paragraph 'Weights only load failed' as one line naming the file."""
    message = str(err)
    found = re.search(r'GLOBAL (\S+) (?:was not an allowed global|whose module)', message)
    if found:
        full = found.group(1)  # torch drops the 'builtins.' of builtins
        full = full if '.' in full else f'builtins.{full}'
        return ForeignGlobalError(
            f'{name} contains {full}, which mmrepa does not load: it reads {READS}. {TRUSTED_WAY}'
        )
    text = message.split('WeightsUnpickler error: ', 1)[-1]
    boilerplate = (
        'Weights only load failed',
        'In PyTorch 2.6',
        'Check the documentation',
        'Please file an issue',
    )
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(boilerplate)
    ]
    reason = (lines[0] if lines else type(err).__name__).rstrip('.')
    return RefusedCheckpointError(
        f'{name} is refused by the restricted loader ({reason}): '
        f'mmrepa reads {READS}. {TRUSTED_WAY}'
    )


# the first bytes of files that are handed to a checkpoint argument by mistake
_MAGIC = (
    (b'\x89PNG', 'a PNG image'),
    (b'\xff\xd8\xff', 'a JPEG image'),
    (b'\x1f\x8b', 'a gzip archive'),
    (b'<?xml', 'an XML file'),
    (b'{', 'a JSON file'),
    (b'[', 'a JSON file'),
)
# how the files torch.save writes start: a zip, or (before torch 1.6) a pickle of its magic number
_TORCH_STARTS = (b'PK\x03\x04', b'\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19')


def _other_kind(file: Any) -> Optional[str]:
    """What the file at ``file`` is, when its name or first bytes say that it is no checkpoint
    at all (an export, an image, a plain pickle), else ``None``."""
    if not isinstance(file, (str, os.PathLike)) or not os.path.isfile(file):
        return None
    path = os.fspath(file)
    stem, ext = os.path.splitext(path)
    with open(path, 'rb') as f:
        head = f.read(16)
    if ext == '.bin' and os.path.isfile(stem + '.xml'):
        return f'the weights of the OpenVINO model {os.path.basename(stem)}.xml'
    if ext == '.onnx':
        return 'an ONNX model'
    if head.startswith(_TORCH_STARTS):
        return None
    found = next((kind for magic, kind in _MAGIC if head.lstrip().startswith(magic)), None)
    if found is None and head[:1] == b'\x80':
        return "a pickle that torch.save did not write (such as tools/test.py --out's)"
    return found


def _not_a_checkpoint(name: str, kind: str, cls=CheckpointError) -> CheckpointError:
    return cls(
        f'{name} is {kind}, not a PyTorch checkpoint: give the .pth file that tools/train.py or '
        'tools/reparameterize.py wrote'
    )


def _unreadable(name: str, err: BaseException) -> CheckpointError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ''
    return CheckpointError(
        f'{name} is not a readable PyTorch checkpoint ({type(err).__name__}: '
        f'{first[:200]}): is it truncated (an interrupted download or copy) or '
        'a file of another kind?'
    )


def load_restricted(file: Any, name: str, map_location: Any = None) -> Any:
    """:func:`read_restricted`, then checked as a checkpoint
    (:func:`.validation.check_checkpoint`)."""
    ckpt = read_restricted(file, name, map_location)
    check_checkpoint(ckpt, name)
    return ckpt


def read_restricted(file: Any, name: str, map_location: Any = None) -> Any:
    """``torch.load(file, weights_only=True)`` with our stand-ins, finished
    (:func:`.stand_ins.finish`): any data file torch saved (a checkpoint, or data such as
    LV-ViT's token-label maps, which the caller checks).

    Args:
        file: A path or a binary file object.
        name: The file for messages (a path, or a URL and its cached file).
        map_location: As for ``torch.load``.

    Raises:
        CheckpointError: one line naming ``name``: not a file torch saved (truncated, another
            format), or refused (:class:`RefusedCheckpointError`, :class:`ForeignGlobalError`
            for a global outside the allow-list).
    """
    try:
        with collect_config_nodes() as nodes, our_allow_list():
            ckpt = torch.load(file, map_location=map_location, weights_only=True)
        ckpt = finish(ckpt, nodes)
    except pickle.UnpicklingError as err:
        kind = None if 'GLOBAL ' in str(err) else _other_kind(file)
        refused = _not_a_checkpoint(name, kind, RefusedCheckpointError) if kind else None
        raise (refused or _refusal(name, err)) from None
    except TypeError as err:  # an allowed class or function called with arguments it refuses
        raise _refusal(name, pickle.UnpicklingError(f'{type(err).__name__}: {err}')) from None
    except RecursionError:
        raise RefusedCheckpointError(
            f'{name} nests its data deeper than any checkpoint does '
            '(Python recursion limit); mmrepa does not load it'
        ) from None
    except Exception as err:  # truncated zip, wrong magic number, a text file, ...
        kind = _other_kind(file)
        raise (_not_a_checkpoint(name, kind) if kind else _unreadable(name, err)) from None
    return ckpt
