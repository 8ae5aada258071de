"""mmrepa's inference API: a model from any mmrepa config (mmdet, mmseg and mmpretrain configs
alike) with its checkpoint, class names and palette, folded if asked. The command-line pieces
the tools share are in :mod:`mmrepa.integrations.cli`."""

import contextlib
import copy
import importlib
import os.path as osp
import warnings
from collections import OrderedDict
from typing import Optional, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from .checkpoint.loading import refuse_wrong_dtypes
from .config.checks import (
    check_checkpoint_fit,
    check_classifier,
    check_custom_imports,
    check_parts,
    check_types,
)
from .config.key_checks import check_keys
from .config.paths import find_config
from .fold import reparameterize


class TextOnceConfig(Config):
    """mmengine's ``Config`` whose ``pretty_text`` (the config as Python, formatted by yapf) is
    formatted once per content. A Runner asks for it up to five times per run (the log, the
    dumped config, the visualizer's copy, the run's meta, every checkpoint's meta), and
    formatting a detector's config is slow: most of a short run's start (docs/speed.md).
    Same content, same text: the texts are kept by content (the repr of ``to_dict()``, what is
    formatted), a few at a time. ``copy.deepcopy`` (which the Runner makes) keeps the class."""

    _texts: 'OrderedDict[str, str]' = OrderedDict()
    _KEEP = 8

    @classmethod
    def of(cls, cfg: Config) -> 'TextOnceConfig':
        """``cfg`` as this class (sharing its contents; ``Config.fromfile`` builds the base
        class whatever class it is called on)."""
        once = cls.__new__(cls)
        once.__dict__.update(cfg.__dict__)  # as Config.__copy__ does
        return once

    @property
    def pretty_text(self) -> str:
        key = f'{self._format_python_code}{self.to_dict()!r}'  # what mmengine formats
        text = self._texts.get(key)
        if text is None:
            text = super().pretty_text
            self._texts[key] = text
            while len(self._texts) > self._KEEP:
                self._texts.popitem(last=False)
        return text


def load_config(config: str, cfg_options: Optional[dict] = None) -> TextOnceConfig:
    """``Config.fromfile`` + ``--cfg-options`` + the checks of
    :mod:`mmrepa.config.checks` that need no build: mmrepa in
    ``custom_imports`` if its types are used, a classifier's neck fits its backbone, every model
    type registered (else "did you mean"). A config named by its path before the configs moved
    into folders per algorithm is found (:func:`~mmrepa.config.paths.
    find_config`). The config formats its text once (:class:`TextOnceConfig`)."""
    cfg = TextOnceConfig.of(Config.fromfile(find_config(config)))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    check_parts(cfg)
    check_custom_imports(cfg)
    check_classifier(cfg)
    check_types(cfg)
    check_keys(cfg)  # of what the Runner builds after its print-out
    return cfg


def _num_classes(cfg: Config) -> Optional[int]:
    """The number of classes the config's model predicts (its main head's ``num_classes``)."""
    model = cfg.model
    heads = [model.get('decode_head'), model.get('bbox_head')]
    roi = (model.get('roi_head') or {}).get('bbox_head')
    heads.append(roi[-1] if isinstance(roi, (list, tuple)) else roi)  # cascade: the last stage
    for head in heads:
        if isinstance(head, dict) and isinstance(head.get('num_classes'), int):
            return head['num_classes']
    return None


def _config_dataset_meta(cfg: Config, registry) -> dict:
    """The metainfo (classes, palette) of the config's test data set, built lazily (no
    annotation is read), as mmdet's ``init_detector`` finds its palette; ``{}`` if the config
    has no data set that builds."""
    for loader in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        dataset = (cfg.get(loader) or {}).get('dataset')
        if not isinstance(dataset, dict):
            continue
        dataset = copy.deepcopy(dataset)
        dataset['lazy_init'] = True
        try:
            return dict(registry.DATASETS.build(dataset).metainfo)
        except Exception:  # noqa: BLE001  a data set type the scope lacks, a wrapper, ...
            continue
    return {}


def _random_palette(n: int) -> list:
    # fixed seed: the same colours on every run and in every tool
    rng = np.random.default_rng(42)
    return [tuple(int(c) for c in rng.integers(0, 256, 3)) for _ in range(n)]


def _dataset_meta(
    cfg: Config, registry, checkpoint: Optional[dict], checkpoint_path: Optional[str]
) -> dict:
    """``model.dataset_meta`` for mmdet's and mmseg's inference and visualizers: the
    checkpoint's ``meta['dataset_meta']`` (what the runner saved from the training set), else
    the config's test data set, else class names made from the head's ``num_classes``. A
    checkpoint without class names is warned about. Always has ``classes`` and a palette
    list of the same length (mmseg's visualizer indexes it; mmdet's accepts a list)."""
    meta = (checkpoint or {}).get('meta') or {}
    if 'dataset_meta' in meta:
        found = {k.lower(): v for k, v in meta['dataset_meta'].items()}  # mmdet 3 lowercases
    elif 'CLASSES' in meta:  # checkpoints of mmdet 2 / mmseg 0.x
        found = dict(classes=meta['CLASSES'])
        if meta.get('PALETTE') is not None:
            found['palette'] = meta['PALETTE']
    else:
        found = {}
    from_config = _config_dataset_meta(cfg, registry)
    if not found.get('classes'):
        if from_config.get('classes'):
            found = dict(from_config)
            source = f"the config's test data set ({len(found['classes'])} classes)"
        else:
            n = _num_classes(cfg) or 1
            found = dict(classes=tuple(f'class_{i}' for i in range(n)))
            source = f'class_0 .. class_{n - 1} (the head has {n} classes)'
        if checkpoint_path:  # no warning for random weights (benchmarks, FLOP counts)
            warnings.warn(
                f'checkpoint {checkpoint_path} has no dataset_meta (class names) in '
                f'its meta; using {source}',
                stacklevel=3,
            )
    classes = list(found['classes'])
    predicted = _num_classes(cfg)
    if predicted and predicted != len(classes):
        warnings.warn(
            f'dataset_meta names {len(classes)} classes but the model predicts '
            f'{predicted}: labels will be drawn with the wrong names',
            stacklevel=3,
        )
    palette = found.get('palette')
    if not isinstance(palette, (list, tuple)) or len(palette) < len(classes):
        palette = from_config.get('palette')
        if palette is None or tuple(from_config.get('classes') or ()) != tuple(classes):
            palette = _random_palette(len(classes))
    found['palette'] = [tuple(c) for c in palette[: len(classes)]]
    return found


@contextlib.contextmanager
def _logs_held_until_success():
    """Hold what mmengine's current logger is told inside, and pass it on only if the block
    succeeds: a model that cannot be built stops a tool with one line, not below what its
    parts logged before the error (mmpretrain's data preprocessor logs an INFO line when the
    config has batch augmentations)."""
    logger, held = MMLogger.get_current_instance(), []

    def hold(record):
        held.append(record)
        return False

    logger.addFilter(hold)
    try:
        yield
    finally:
        logger.removeFilter(hold)
    for record in held:
        logger.handle(record)


def build_model(cfg: Config) -> nn.Module:
    """Build ``cfg.model`` in the config's default scope as mmengine's Runner does: a top-level
    ``data_preprocessor`` (where mmpretrain configs keep it) goes into the model. SyncBN is
    reverted to BN (outside a process group it cannot run). What the build logs is printed
    after it, and not at all if it fails (its error comes first, alone)."""
    scope = cfg.get('default_scope', 'mmengine')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry')
    model_cfg = copy.deepcopy(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    with _logs_held_until_success():
        model = registry.MODELS.build(model_cfg)
    return revert_sync_batchnorm(model)


def init_model(
    config: Union[str, Config],
    checkpoint: Optional[str] = None,
    device: Union[str, torch.device] = 'cpu',
    cfg_options: Optional[dict] = None,
    reparam: bool = False,
) -> nn.Module:
    """Build the config's model in its default scope, load ``checkpoint``, eval mode; with
    ``reparam=True`` fold it (:func:`mmrepa.reparameterize`).

    SyncBN is reverted to BN (outside a process group it cannot run). The backbone's
    ``init_cfg`` weights are not loaded; ``checkpoint`` is, strictly. The model gets what
    mmdet's ``inference_detector`` / ``DetInferencer`` and mmseg's ``inference_model`` /
    ``MMSegInferencer`` read, as their own loaders set it: ``model.cfg`` (the config) and
    ``model.dataset_meta`` (``classes`` and ``palette``, from the checkpoint's
    ``meta['dataset_meta']``; without it from the config's test data set, with a warning).
    The folded model takes the same inputs and gives the same predictions as the unfolded one.
    """
    if isinstance(config, str):
        cfg = load_config(config, cfg_options)
    else:
        cfg = copy.deepcopy(config)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    model = build_model(cfg)
    registry = importlib.import_module(f'{cfg.get("default_scope", "mmengine")}.registry')
    loaded = None
    if checkpoint:
        if isinstance(getattr(model, 'backbone', None), nn.Module) and osp.isfile(checkpoint):
            # another model's checkpoint: one line, not mmengine's lists of keys
            check_checkpoint_fit(model.backbone, checkpoint, 'checkpoint')
        hook = refuse_wrong_dtypes(model, checkpoint)
        try:
            loaded = load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
        finally:
            hook.remove()
    model.eval()
    if reparam:
        model = reparameterize(model)
    model.cfg = cfg
    model.dataset_meta = _dataset_meta(cfg, registry, loaded, checkpoint)
    return model.to(device)
