"""The model checks a tool runs before it builds anything.

mmengine's Runner writes the environment and the whole config (~540 lines) before it builds the
model, so a typo in a type, an unknown ``arch`` or a checkpoint of another model used to surface
below all that, in a traceback. Our tools call :func:`check_custom_imports`,
:func:`check_classifier` and :func:`check_types` (from :func:`mmrepa.apis.load_config`) and
:func:`check_model` (from :func:`mmrepa.integrations.cli.inputs.check_inputs`) first, which raise
:class:`~mmrepa.errors.ConfigError` or :class:`~mmrepa.errors.CheckpointError` with one line
per problem.

mmdet's, mmseg's and mmpretrain's own tools (``mim train mmdet CONFIG``) build our backbones
inside their Runner, after the print-out; there the excepthook of :mod:`mmrepa.seams` (their
opt-in, :mod:`mmrepa.one_line_errors`) turns the errors whose cause is known into one line at
the end instead of a traceback (see :func:`mmrepa.config.explain.explain`).
"""

import copy
import importlib
import os
import sys
import warnings
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import DefaultScope, Registry

from ..errors import CheckpointError, ConfigError
from .paths import closest

# The registries a model config's ``type``s come from: modules and losses, assigners and coders
# (mmdet's TASK_UTILS), init_cfg, and mmpretrain's batch augmentations.
MODEL_REGISTRIES = ('MODELS', 'TASK_UTILS', 'WEIGHT_INITIALIZERS', 'BATCH_AUGMENTS')


def config_scope(cfg: Config) -> str:
    return cfg.get('default_scope') or 'mmengine'


def model_registries(scope: str) -> List[Registry]:
    """The scope's model registries, and mmrepa's layer registry (its norms and activations
    resolve without the ``mmrepa.`` prefix inside our backbones)."""
    from ..registry import MODELS as LAYERS

    module = importlib.import_module(f'{scope}.registry')
    found = [getattr(module, name, None) for name in MODEL_REGISTRIES]
    return [r for r in found if isinstance(r, Registry)] + [LAYERS]


def _resolves(name: str, registries: Iterable[Registry]) -> bool:
    for registry in registries:
        try:
            if registry.get(name) is not None:  # with its parents and 'scope.Name' prefixes
                return True
        except Exception:  # noqa: BLE001  mmengine's fallback import of dotted names
            continue
    # nms and RoI layers are looked up in mmcv.ops by name, not in a registry
    ops = sys.modules.get('mmcv.ops')
    return ops is not None and hasattr(ops, name)


def _known_names(registries: Iterable[Registry]) -> Dict[str, str]:
    """Every registered name, lower-cased -> as to write it in a config (other scopes' names
    with their prefix: ``mmpretrain.ConvNeXt`` from mmdet)."""
    names, roots = {}, []
    for registry in registries:
        node = registry
        while node is not None:
            names.update({n.lower(): n for n in node.module_dict if n.lower() not in names})
            roots.append(node)
            node = node.parent
    for root in roots:
        for scope, child in root.children.items():
            for n in child.module_dict:
                names.setdefault(n.lower(), f'{scope}.{n}')
    return names


def did_you_mean(name: str, registries: Iterable[Registry]) -> str:
    """``"did you mean 'RePaSwin'?"`` for a type that does not resolve in ``registries`` (the
    closest registered names, compared without case and scope prefix), or ``''``."""
    names = _known_names(registries)
    bare = name.rsplit('.', 1)[-1].lower()
    close = closest(bare, names)  # RePaSwn: RePaSwin, not also PRepBNSwin
    return 'did you mean ' + ' or '.join(repr(names[c]) for c in close) + '?' if close else ''


def _typed_nodes(node, key: str, scope: str) -> Iterator[Tuple[str, str, str]]:
    """(key, type, scope) of every dict with a string ``type`` under ``node``; ``_scope_``
    switches the scope of its subtree, as mmengine's build does."""
    if isinstance(node, dict):
        scope = node.get('_scope_') or scope
        if isinstance(node.get('type'), str):
            yield f'{key}.type', node['type'], scope
        for name, value in node.items():
            yield from _typed_nodes(value, f'{key}.{name}', scope)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _typed_nodes(value, f'{key}.{i}', scope)


def unknown_types(cfg: Config) -> List[str]:
    """One line per ``type`` in ``cfg.model`` (and a top-level ``data_preprocessor``) that no
    registry of its scope knows, with the closest registered names."""
    problems = []
    for part in ('model', 'data_preprocessor'):
        for key, name, scope in _typed_nodes(cfg.get(part), part, config_scope(cfg)):
            try:
                registries = model_registries(scope)
            except ImportError:  # a scope not installed: the tool says so when it builds
                continue
            if not _resolves(name, registries):
                hint = did_you_mean(name, registries) or (
                    'check the spelling, or add the package that registers it to custom_imports'
                )
                problems.append(
                    f'{key}={name!r} is not a registered type in scope {scope!r}: {hint}'
                )
    return problems


# config parts the Runner and the model builders read as dicts of options (None: not used)
DICT_PARTS = (
    'model',
    'model.backbone',
    'model.data_preprocessor',
    *(f'{split}_dataloader' for split in ('train', 'val', 'test')),
    *(f'{split}_dataloader.dataset' for split in ('train', 'val', 'test')),
    *(f'{split}_cfg' for split in ('train', 'val', 'test')),
    'optim_wrapper',
    'optim_wrapper.optimizer',
    'default_hooks',
    'env_cfg',
)


def check_parts(cfg: Config) -> None:
    """Refuse a part of the config that is no dict (``--cfg-options model=1``), which the
    Runner and the checks would meet as an AttributeError deep inside: one line naming it."""
    for key in DICT_PARTS:
        node = cfg
        for name in key.split('.'):
            node = node.get(name) if isinstance(node, (dict, Config)) else None
        if node is not None and not isinstance(node, dict):
            raise ConfigError(
                f'{key} is {repr(node)[:40]} (of type {type(node).__name__}), not a dict of '
                f'options: set its keys ({key}.KEY=VALUE), not the part itself'
            )


def check_types(cfg: Config) -> None:
    """Raise :class:`ConfigError`, one line per unknown model type (see :func:`unknown_types`)."""
    problems = unknown_types(cfg)
    if problems:
        raise ConfigError('\n'.join(problems))


def _mmrepa_types() -> set:
    from mmengine.registry import HOOKS, MODELS

    return {
        name
        for registry in (MODELS, HOOKS)
        for name, cls in registry.module_dict.items()
        if cls.__module__.startswith('mmrepa.')
    }


def check_custom_imports(cfg: Config) -> None:
    """Refuse a config that uses mmrepa modules without importing mmrepa itself.

    Our tools import mmrepa anyway, but mmdet's and mmseg's tools would fail on such a config
    with an unhelpful "not in the registry" error; say what to add instead.
    """
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    if any(i == 'mmrepa' or i.startswith('mmrepa.') for i in imports):
        return
    used = sorted({name for _, name, _ in _typed_nodes(cfg.to_dict(), 'cfg', '')} & _mmrepa_types())
    if used:
        raise ConfigError(
            f'config {cfg.filename} uses {", ".join(used)} from mmrepa but does not import '
            "mmrepa: add custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False) "
            'to it (mmdet and mmseg tools need it to find these modules).'
        )


def check_classifier(cfg: Config) -> None:
    """Refuse an mmpretrain classifier whose backbone gives several feature maps to a neck and
    head that use one: ``GlobalAveragePooling`` pools each map and the head reads the last, so
    the other stages' outputs (and their norms) would be computed, trained and never used."""
    model = cfg.get('model') or {}
    backbone, neck = model.get('backbone') or {}, model.get('neck') or {}
    out_indices = backbone.get('out_indices')
    if (
        model.get('type') == 'ImageClassifier'
        and neck.get('type') == 'GlobalAveragePooling'
        and out_indices is not None
        and len(out_indices) != 1
    ):
        raise ConfigError(
            f'config {cfg.filename}: model.backbone.out_indices={tuple(out_indices)} gives '
            f"{len(out_indices)} feature maps, but the classifier's GlobalAveragePooling neck "
            "and head use one (the last stage's): set out_indices=(3, ) (or the index of the "
            'stage to classify from).'
        )


def build_backbone(cfg: Config) -> Optional[nn.Module]:
    """``cfg.model.backbone`` alone (without loading its ``init_cfg`` weights), or ``None`` if
    the model has none: its constructor validates ``arch``, ``out_indices``, ratios, ... and
    is cheap next to the Runner. A :class:`ConfigError` (or a ``TypeError``: an unknown
    argument) comes out as one line naming ``model.backbone``."""
    backbone = (cfg.get('model') or {}).get('backbone')
    if not isinstance(backbone, dict) or not isinstance(backbone.get('type'), str):
        return None
    backbone = copy.deepcopy(backbone)
    backbone.pop('init_cfg', None)
    scope = config_scope(cfg)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    # the Runner builds it again and warns then; SyncBN builds without a process group
    with DefaultScope.overwrite_default_scope(scope), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            return registry.build(backbone)
        except (ConfigError, TypeError) as err:
            raise ConfigError(f'model.backbone ({backbone["type"]}): {err}') from None


def _checkpoint_weights(path: str) -> dict:
    """The weights of a model checkpoint (any layout :data:`~mmrepa.checkpoint.loading.
    WEIGHT_KEYS` lists), read without running its code and without a log line."""
    from ..checkpoint import load_checkpoint_file
    from ..checkpoint.loading import WEIGHT_KEYS

    ckpt = load_checkpoint_file(path)
    if isinstance(ckpt, dict):
        ckpt = next((ckpt[k] for k in WEIGHT_KEYS if isinstance(ckpt.get(k), dict)), ckpt)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'{path} holds a {type(ckpt).__name__}, not a checkpoint dict')
    return {k[len('module.') :] if k.startswith('module.') else k: v for k, v in ckpt.items()}


def check_checkpoint_fit(backbone: nn.Module, path: str, where: str) -> None:
    """Load the backbone's part of the model checkpoint ``path`` into ``backbone`` as the
    Runner's ``load_from`` will (mmengine's non-strict loader, so our backbones' own checks
    run: shapes, folded or not, layouts); raises :class:`CheckpointError` for a checkpoint of
    another model. ``where``: the option it comes from, for the message."""
    from mmengine.runner.checkpoint import load_state_dict

    from ..checkpoint.loading import check_dtypes

    state = _checkpoint_weights(path)
    own = {k: v for k, v in state.items() if k.startswith('backbone.')}
    model = nn.ModuleDict(dict(backbone=backbone))  # the messages name 'backbone.<key>'
    if not set(own) & set(model.state_dict()):
        found = sorted({k.split('.')[0] for k in state})[:8]
        raise CheckpointError(
            f'{path} ({where}) holds no weights of this {type(backbone).__name__} backbone '
            f'(its top-level names: {", ".join(found) or "none"}): give a checkpoint of this '
            "config's model, as tools/train.py saves it"
        )
    check_dtypes(model, own, f'{path} ({where})')
    try:
        load_state_dict(model, own, strict=False, logger='silent')
    except CheckpointError as err:
        raise CheckpointError(f'{path} ({where}): {err}') from None


def check_model(cfg: Config, checkpoints: Iterable[Tuple[str, str, Optional[str]]] = ()) -> None:
    """:func:`check_types`, :func:`build_backbone` and, for each local ``(what, where it comes
    from, path)`` of ``checkpoints`` (whole-model checkpoints: ``load_from``, a tool's
    CHECKPOINT), :func:`check_checkpoint_fit`. Raises on the first problem."""
    from .inputs import is_remote

    check_types(cfg)
    backbone = build_backbone(cfg)
    for _, where, path in checkpoints:
        local = os.path.expanduser(path or '')
        if backbone is not None and path and not is_remote(path) and os.path.isfile(local):
            check_checkpoint_fit(backbone, local, where)
