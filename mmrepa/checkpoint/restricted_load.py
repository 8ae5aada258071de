"""Reading the checkpoints other projects write, safely: no code from the file ever runs.

torch's ``weights_only`` loader (the default since torch 2.6) refuses the release checkpoints of
RePaViT and timm's ``train.py`` (an ``argparse.Namespace`` under ``args``) and of SLAB and
Microsoft Swin (a yacs ``CfgNode`` under ``config``). :func:`load_checkpoint_file` tries that
loader first; if it refuses a global, the file is read again by an unpickler that resolves
globals from an explicit allow-list only: what torch's ``weights_only`` loader allows (tensors,
containers, numbers, dtypes, and the safe globals mmrepa registers for mmengine), plus inert
stand-ins for the foreign configuration objects, which keep their data and nothing else. Any
other global is refused by name before anything is called.

Installed for mmengine's local-file loader on ``import mmrepa``, so ``init_cfg=Pretrained``,
``load_from``, resume and the tools all read such files.
"""
import _compat_pickle
import os.path as osp
import pickle
from typing import Any, Dict

import torch
from mmengine.runner.checkpoint import CheckpointLoader

from ..errors import CheckpointError


class ForeignNamespace:
    """What an ``argparse.Namespace`` in a checkpoint is rebuilt as: its attributes only."""

    def __repr__(self) -> str:
        return f'ForeignNamespace({vars(self)})'


class ForeignConfig(dict):
    """What a yacs ``CfgNode`` or an ``EasyDict`` in a checkpoint is rebuilt as: a dict (keys
    also readable as attributes) without the original class's behaviour."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


STAND_INS = {
    'argparse.Namespace': ForeignNamespace,
    'yacs.config.CfgNode': ForeignConfig,
    'easydict.EasyDict': ForeignConfig,
}


class ForeignGlobalError(CheckpointError, pickle.UnpicklingError):
    """The file asks for a global that is not on the allow-list."""


def _allowed_globals() -> Dict[str, Any]:
    from torch import _weights_only_unpickler
    allowed = dict(_weights_only_unpickler._get_allowed_globals())
    for item in torch.serialization.get_safe_globals():
        obj, name = item if isinstance(item, tuple) else (
            item, f'{item.__module__}.{item.__qualname__}')
        allowed[name] = obj
    allowed.update(STAND_INS)
    return allowed


def _restricted_pickle_module(filename: str):
    allowed = _allowed_globals()

    class RestrictedUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            # protocol-2 pickles (torch's default) name Python 2 modules, e.g. __builtin__.set
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            full = f'{module}.{name}'
            if full in allowed:
                return allowed[full]
            raise ForeignGlobalError(
                f'{filename} contains {full}, which mmrepa does not load: it reads tensors, '
                'containers, numbers, strings, numpy data and mmengine records, and rebuilds '
                f'{", ".join(sorted(STAND_INS))} as plain data. If you trust the file, load it '
                'once with torch.load(weights_only=False) and save the weights alone: '
                "torch.save(ckpt['model'], 'weights.pth')")

    class Module:  # what torch.load needs of a pickle module
        Unpickler = RestrictedUnpickler

        @staticmethod
        def load(file, **kwargs):
            return RestrictedUnpickler(file, **kwargs).load()

    return Module


def load_checkpoint_file(filename: str, map_location='cpu') -> Any:
    """``torch.load`` a local checkpoint of any project's layout without running its code.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a readable checkpoint (truncated, another format), or it holds a
            global outside the allow-list (:class:`ForeignGlobalError`); the message says what
            to do.
    """
    filename = osp.expanduser(str(filename))
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename} does not exist: check the path (see '
                                "the README's 'Data and checkpoints')")
    try:
        try:
            return torch.load(filename, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError:
            pass  # a global or opcode torch does not allow: the allow-list below decides
        return torch.load(filename, map_location=map_location, weights_only=False,
                          pickle_module=_restricted_pickle_module(filename))
    except CheckpointError:
        raise
    except Exception as err:  # truncated zip, wrong magic number, a text file, ...
        raise CheckpointError(
            f'{filename} is not a readable PyTorch checkpoint ({type(err).__name__}: '
            f'{str(err).splitlines()[0] if str(err) else ""}): is it truncated (an interrupted '
            'download or copy) or a file of another kind?') from err


def load_from_local_restricted(filename: str, map_location=None):
    """mmengine's local-file loader, reading through :func:`load_checkpoint_file`."""
    return load_checkpoint_file(filename, map_location)


def install_restricted_loader() -> None:
    """Make mmengine's loader for local paths (``load_from``, resume, ``init_cfg``,
    ``load_checkpoint``) use :func:`load_checkpoint_file`."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_restricted, force=True)
