"""Loading pretrained weights into a backbone, with every key accounted for.

``strict=False`` hides renamed keys and missing BatchNorm statistics; these helpers report
missing and unexpected keys by name and refuse to leave a core weight uninitialised.
"""

import fnmatch
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader

from ..errors import CheckpointError, MissingKeysError
from ..fold import check_fold_states
from .validation import EMA_KEYS, WEIGHT_KEYS, check_state_dict  # noqa: F401 (re-exported)


class LoadReport(NamedTuple):
    """Outcome of :func:`load_state_dict_checked`: keys by name."""

    loaded: List[str]
    missing: List[str]  # allowed to be missing, left as initialised
    unexpected: List[str]  # in the checkpoint, not used


def read_state_dict(filename: str, use_ema: bool = False) -> Dict[str, torch.Tensor]:
    """Read a checkpoint (path, URL or ``open-mmlab://`` etc.) and return its weights.

    Takes the weights from any layout in :data:`WEIGHT_KEYS` (or a plain state dict) and ignores
    the rest (optimizer, arguments, configs). ``use_ema``: the EMA weights instead
    (:data:`EMA_KEYS`, or mmengine's ``state_dict``, which holds them already); a checkpoint
    without them is an error that lists its keys.
    """
    # every scheme's loader is mmrepa's (schemes.py): restricted, then checked (validation.py)
    ckpt = CheckpointLoader.load_checkpoint(filename, map_location='cpu')
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f'{filename} holds a {type(ckpt).__name__}, not a state dict or a checkpoint dict'
        )
    if use_ema:
        keys = EMA_KEYS + (('state_dict',) if 'ema_state_dict' in ckpt else ())
        found = [k for k in keys if isinstance(ckpt.get(k), dict)]
        if not found:
            raise MissingKeysError(
                f'{filename} has no EMA weights (its keys: {sorted(ckpt)[:12]}); '
                'load it without use_ema'
            )
        return ckpt[found[0]]
    for key in WEIGHT_KEYS:
        if isinstance(ckpt.get(key), dict):
            return ckpt[key]
    return ckpt


def strip_prefixes(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Drop ``module.`` (DDP) prefixes; of a whole detector/segmentor keep the backbone only."""
    check_state_dict(state_dict, 'the state dict')  # a dict built in memory, not read from a file
    state_dict = {
        k[len('module.') :] if k.startswith('module.') else k: v for k, v in state_dict.items()
    }
    if any(k.startswith('backbone.') for k in state_dict):
        state_dict = {
            k[len('backbone.') :]: v for k, v in state_dict.items() if k.startswith('backbone.')
        }
    return state_dict


def resize_to_model(
    state_dict: Dict[str, torch.Tensor],
    model: nn.Module,
    suffix: str,
    resize: Callable[[torch.Tensor, torch.Size], torch.Tensor],
) -> Dict[str, torch.Tensor]:
    """``resize(tensor, shape)`` every ``*suffix`` entry whose shape differs from the model's
    (position tables of a checkpoint trained at another window or image size), in place."""
    own = model.state_dict()
    for k, v in state_dict.items():
        if k.endswith(suffix) and k in own and v.shape != own[k].shape:
            state_dict[k] = resize(v, own[k].shape)
    return state_dict


def _shorten(keys: Iterable[str], limit: int = 12) -> str:
    keys = list(keys)
    more = f', ... ({len(keys) - limit} more)' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def check_shapes(
    module: nn.Module,
    state_dict: Dict[str, torch.Tensor],
    prefix: str = '',
    source: str = 'checkpoint',
    hint: str = 'another arch (embed_dims, depths, idle_ratio, window_size)',
) -> None:
    """Raise on the first tensor of ``state_dict`` whose shape differs from ``module``'s.

    ``prefix``: where ``module`` sits in ``state_dict`` (``'backbone.'`` in a detector's);
    ``hint``: what the checkpoint may be instead, for the message.
    """
    for key, param in module.state_dict().items():
        value = state_dict.get(prefix + key)
        if value is not None and tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(
                f'{source} does not fit this model: {prefix}{key} has shape '
                f'{tuple(value.shape)} in the checkpoint but {tuple(param.shape)} in the model. '
                f'Is it a checkpoint of {hint}?'
            )


def check_dtypes(
    module: nn.Module, state_dict: Dict[str, torch.Tensor], source: str = 'checkpoint'
) -> List[str]:
    """Raise on the first tensor of ``state_dict`` that cannot be the value of ``module``'s
    tensor of that name (torch's ``copy_`` would cast it silently): a bool, integer or complex
    value for a floating-point weight, a complex one for any. Returns the names of floating
    tensors of another precision (float16, bfloat16, float64), which loading converts."""
    converted = []
    for key, own in module.state_dict().items():
        value = state_dict.get(key)
        if not isinstance(value, torch.Tensor) or value.dtype == own.dtype:
            continue
        if value.is_complex() or (own.is_floating_point() and not value.is_floating_point()):
            raise CheckpointError(
                f'{source}: {key} is {value.dtype} in the checkpoint but {own.dtype} in the '
                'model; loading would cast it (a layer of 0/1, whole numbers or real parts): '
                'is the file a checkpoint of this model?'
            )
        if value.is_floating_point() and own.is_floating_point():
            converted.append(key)
    return converted


def refuse_wrong_dtypes(model: nn.Module, source: str):
    """Check every state dict loaded into ``model`` with :func:`check_dtypes` (a pre-hook of
    its root; mmengine's and torch's loaders both call it), and log the conversions; returns
    the hook's handle."""

    def hook(module, state_dict, prefix, *args):
        if prefix:  # the root's call sees the whole state dict
            return
        converted = check_dtypes(module, state_dict, source)
        if converted:
            kinds = sorted({str(state_dict[k].dtype) for k in converted})
            print_log(
                f'{source}: {len(converted)} tensor(s) in {", ".join(kinds)} converted to '
                "the model's precision",
                logger='current',
            )

    return model.register_load_state_dict_pre_hook(hook)


def load_state_dict_checked(
    module: nn.Module,
    state_dict: Dict[str, torch.Tensor],
    may_be_missing: Iterable[str] = (),
    source: str = 'checkpoint',
    explain: Optional[Callable[[List[str], List[str]], Optional[str]]] = None,
    hint: Optional[str] = None,
) -> LoadReport:
    """Load ``state_dict`` into ``module`` and account for every key.

    Args:
        module: The model to load into.
        state_dict: Already converted to ``module``'s names.
        may_be_missing: Glob patterns of keys that may stay as initialised (for example the
            output norms of a detection backbone when loading a classification checkpoint).
            ``num_batches_tracked`` may always be missing.
        source: Name of the checkpoint, for messages.
        explain: ``explain(missing, unexpected)``: the likely cause, in one line, when keys
            the model needs are missing (e.g. another attention kind), else None.
        hint: What a checkpoint of other shapes may be, for the message (default: a backbone
            of another arch, :func:`check_shapes`).

    Raises:
        ValueError: a tensor has another shape than the model's (another architecture).
        KeyError: a key the model needs is missing (a core weight or a BN statistic).
    """
    check_state_dict(state_dict, source)
    own = module.state_dict()
    check_fold_states(module, state_dict)
    check_shapes(module, state_dict, source=source, **({'hint': hint} if hint else {}))
    check_dtypes(module, state_dict, source)
    patterns = list(may_be_missing) + ['*num_batches_tracked']
    missing = [k for k in own if k not in state_dict]
    core = [k for k in missing if not any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    unexpected = [k for k in state_dict if k not in own]
    cause = explain(core, unexpected) if core and explain else None
    if cause:
        raise MissingKeysError(f'{source}: {cause}')
    if core:
        raise MissingKeysError(
            f'{source} lacks {len(core)} weight(s) or BatchNorm statistic(s) this model needs: '
            f'{_shorten(core)}. Loading it would leave them at their initial values; check that '
            f'the checkpoint matches the model (arch, idle_ratio, ffn_norm, deploy).'
        )
    incompatible = module.load_state_dict(
        {k: v for k, v in state_dict.items() if k in own}, strict=False
    )
    assert not incompatible.unexpected_keys
    if missing:
        print_log(
            f'{source}: {len(missing)} key(s) not in the checkpoint, left as initialised: '
            f'{_shorten(missing)}',
            logger='current',
            level=30,
        )
    if unexpected:
        print_log(
            f'{source}: {len(unexpected)} key(s) not used by '
            f'{type(module).__name__}: {_shorten(unexpected)}',
            logger='current',
            level=30,
        )
    return LoadReport([k for k in own if k in state_dict], missing, unexpected)
