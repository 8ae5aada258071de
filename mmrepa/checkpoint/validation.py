"""What a checkpoint must look like before anything uses it.

Every checkpoint mmrepa reads (``init_cfg``, ``load_from``, resume, ``mmrepa.apis.init_model``,
the tools, ``RepOptVGG(scales=...)``) passes :func:`check_checkpoint` right after the load, so a
malformed file stops with one line naming the file and the key, not with an ``AttributeError``
deep in a loader, and NaN weights never reach a model.
"""

from typing import Any, Mapping

import torch

from ..errors import CheckpointError
from .stand_ins import ForeignConfig

# Where each project's checkpoints keep their weights: mmengine (mmdet, mmseg, mmpretrain,
# mmrepa) and timm train.py (sail-sg/metaformer) 'state_dict'; RePaViT/DeiT, SLAB and Microsoft
# Swin 'model'. EMA weights: timm 'state_dict_ema', RePaViT/DeiT 'model_ema'; mmengine's EMAHook
# already saves the averaged weights as 'state_dict' (and the raw ones as 'ema_state_dict').
WEIGHT_KEYS = ('state_dict', 'model', 'module')
EMA_KEYS = ('state_dict_ema', 'model_ema')
_ALL_WEIGHT_KEYS = WEIGHT_KEYS + EMA_KEYS + ('ema_state_dict',)

MAX_DIMS = 8  # no layer of a vision model has a weight of more dimensions


def _name(key: Any) -> str:
    """A key for a one-line message: quoted, escaped, short."""
    text = repr(key) if isinstance(key, str) else f'{type(key).__name__} {key!r}'
    return text if len(text) <= 80 else text[:77] + '...'


def check_checkpoint(ckpt: Any, source: str) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` is a dict whose weights (under one of
    :data:`WEIGHT_KEYS`, :data:`EMA_KEYS` or ``ema_state_dict``, or the dict itself when it has
    none) pass :func:`check_state_dict` and whose ``meta`` names classes by strings."""
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f'{source} holds a {type(ckpt).__name__}, not a checkpoint dict or a state dict'
        )
    _check_meta(ckpt.get('meta'), source)
    # (a config stored under one of these names is not weights: ForeignConfig, see stand_ins)
    found = [
        k
        for k in _ALL_WEIGHT_KEYS
        if isinstance(ckpt.get(k), dict) and not isinstance(ckpt[k], ForeignConfig)
    ]
    for key in found:
        check_state_dict(ckpt[key], source, f'{key} ')
    if not found:
        check_state_dict(ckpt, source)


def check_state_dict(state_dict: Mapping, source: str, where: str = '') -> None:
    """Every key a string, every value a dense tensor of at most :data:`MAX_DIMS` dimensions
    without hooks or attributes, every floating-point value finite. ``where``: the key the
    state dict sits under and a space, for the message."""
    if not isinstance(state_dict, Mapping):
        raise CheckpointError(
            f'{source}: {where or "the state dict "}is a '
            f'{type(state_dict).__name__}, not a dict of tensors'
        )
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise CheckpointError(
                f'{source}: {where}key {_name(key)} is not a parameter name (a '
                'state dict maps names to tensors): is it a checkpoint of a '
                'model?'
            )
        _check_tensor(value, f'{source}: {where}key {_name(key)}')
    _check_metadata(getattr(state_dict, '_metadata', None), source, where)


def repeats_values(value: torch.Tensor) -> bool:
    """A view that shows its stored values more than once (a stride of 0, as ``expand``
    makes): more values than the file holds, which every full read (a finiteness check, a
    copy) would materialise. torch.save of a weight never writes one."""
    if value.device.type == 'meta' or value.element_size() == 0:
        return False
    return value.numel() > value.untyped_storage().nbytes() // value.element_size()


def _check_tensor(value: Any, what: str) -> None:
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise CheckpointError(
            f'{what} holds a {type(value).__name__}, not a tensor: a state dict '
            'maps parameter names to tensors'
        )
    # torch restores both from the file; a weight has neither (torch.save of a state dict)
    if value._backward_hooks or vars(value):
        raise CheckpointError(f'{what} is a tensor carrying hooks or attributes; weights do not')
    if value.layout != torch.strided:
        raise CheckpointError(f'{what} is a {value.layout} tensor; mmrepa loads dense weights')
    if value.dim() > MAX_DIMS:
        raise CheckpointError(
            f'{what} has {value.dim()} dimensions (shape '
            f'{tuple(value.shape)}); no weight has more than {MAX_DIMS}'
        )
    if repeats_values(value):
        stored = value.untyped_storage().nbytes() // value.element_size()
        raise CheckpointError(
            f'{what} is a view showing {stored} stored value(s) as {value.numel()} (shape '
            f'{tuple(value.shape)}, stride {value.stride()}); weights are saved whole'
        )
    floating = value.is_floating_point() or value.is_complex()
    if floating and value.device.type != 'meta' and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise CheckpointError(
            f'{what} holds {bad} NaN or infinite value(s) of {value.numel()}: '
            'the training that wrote it diverged, or the file is damaged'
        )


def _check_metadata(metadata: Any, source: str, where: str) -> None:
    """``state_dict._metadata`` (module versions, which torch's loader compares with ints)."""
    if metadata is None:
        return
    ok = isinstance(metadata, dict) and all(
        isinstance(k, str)
        and isinstance(v, dict)
        and all(isinstance(name, str) and (type(n) is int or n is None) for name, n in v.items())
        for k, v in metadata.items()
    )
    if not ok:
        raise CheckpointError(
            f'{source}: the _metadata of {where or "the state dict "}is not a '
            'dict of module names to version numbers, as torch writes it'
        )


def _check_meta(meta: Any, source: str) -> None:
    """mmengine's ``meta``: the class names (``dataset_meta.classes``, mmdet 2 / mmseg 0.x
    ``CLASSES``) name the model's outputs in every tool, so they must be strings."""
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise CheckpointError(f"{source}: 'meta' holds a {type(meta).__name__}, not a dict")
    dataset_meta = meta.get('dataset_meta')
    if dataset_meta is not None and not isinstance(dataset_meta, dict):
        raise CheckpointError(
            f"{source}: 'meta.dataset_meta' holds a {type(dataset_meta).__name__}, not a dict"
        )
    for where, classes in (
        ('meta.dataset_meta.classes', (dataset_meta or {}).get('classes')),
        ('meta.CLASSES', meta.get('CLASSES')),
    ):
        if classes is None:
            continue
        if not isinstance(classes, (list, tuple)):
            raise CheckpointError(
                f"{source}: '{where}' holds a {type(classes).__name__}, not a list of class names"
            )
        odd = [c for c in classes if not isinstance(c, str)]
        if odd:
            raise CheckpointError(
                f"{source}: '{where}' holds a {type(odd[0]).__name__} among "
                'its class names; class names are strings'
            )
