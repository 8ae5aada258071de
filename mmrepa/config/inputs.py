"""Check, before anything is built, that the files a tool will read exist and fit the config.

A newcomer's first run usually lacks the data set or the ImageNet weights; without this check it
ends in a long traceback from deep inside pycocotools or the checkpoint loader, after the model
and the data loaders were built. :func:`find_missing_inputs` names every missing path at once
instead and :func:`class_filter_problems` the class filters of COCO-format data sets that do not
fit their files; the tools raise them (:func:`mmrepa.integrations.cli.inputs.check_inputs`),
and :func:`config_inputs` lists what no output may replace.
"""

import difflib
import json
import os.path as osp
import re
import sys
from typing import Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from mmengine.config import Config
from mmengine.fileio import join_path
from mmengine.utils import is_abs

README_SECTION = 'README.md "Data and checkpoints"'

# URLs and mmengine's checkpoint shorthands (open-mmlab://, torchvision://, mmcls://, s3://, ...)
_REMOTE = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')

_PREFIX_NAMES = {
    'img': 'image directory',
    'img_path': 'image directory',
    'seg': 'segmentation map directory',
    'seg_map_path': 'segmentation map directory',
}


class MissingInput(NamedTuple):
    """A path a tool needs that does not exist."""

    what: str  # e.g. 'train annotation file'
    key: str  # where it comes from, e.g. 'train_dataloader.dataset.ann_file'
    path: str

    def __str__(self) -> str:
        return f'missing {self.what}: {self.path} ({self.key}; see {README_SECTION})'


def is_remote(path: str) -> bool:
    """True for URLs and ``scheme://`` paths, which are fetched, not read from disk."""
    return bool(_REMOTE.match(path))


def _dataset_paths(ds, key: str, split: str) -> Iterator[Tuple[str, str, str]]:
    """(what, key, path) of every local path a dataset config reads, joined with ``data_root``
    exactly as mmengine's ``BaseDataset._join_prefix`` joins them; wrappers are followed."""
    if not isinstance(ds, dict):
        return
    # RepeatDataset / ClassBalancedDataset / MultiImageMixDataset wrap one, ConcatDataset many
    if isinstance(ds.get('dataset'), dict):
        yield from _dataset_paths(ds['dataset'], f'{key}.dataset', split)
    for i, sub in enumerate(ds.get('datasets') or []):
        yield from _dataset_paths(sub, f'{key}.datasets.{i}', split)
    data_root = ds.get('data_root') or ''
    if ds.get('backend_args') or is_remote(data_root):
        return  # another storage backend (or a path mapping): the paths are not local files
    if data_root:
        yield f'{split} data root', f'{key}.data_root', data_root
    ann_file = ds.get('ann_file') or ''
    if isinstance(ann_file, str) and ann_file:
        if not is_abs(ann_file) and data_root:
            ann_file = join_path(data_root, ann_file)
        yield f'{split} annotation file', f'{key}.ann_file', ann_file
    prefix = ds.get('data_prefix') or {}
    if isinstance(prefix, str):  # mmpretrain accepts a bare image prefix
        prefix = dict(img_path=prefix)
    for name, value in prefix.items():
        if not isinstance(value, str) or not value:
            continue  # '' is data_root itself; anything else fails in the dataset anyway
        if not is_abs(value) and data_root:
            value = join_path(data_root, value)
        what = _PREFIX_NAMES.get(name, f'data_prefix.{name} directory')
        yield f'{split} {what}', f'{key}.data_prefix.{name}', value


def _evaluator_paths(evaluator, key: str, split: str) -> Iterator[Tuple[str, str, str]]:
    """Annotation files that metrics read when they are built (e.g. mmdet's CocoMetric)."""
    metrics = evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]
    for i, metric in enumerate(metrics):
        if (
            isinstance(metric, dict)
            and isinstance(metric.get('ann_file'), str)
            and metric['ann_file']
            and not metric.get('backend_args')
        ):
            sub = key if isinstance(evaluator, dict) else f'{key}.{i}'
            yield f'{split} evaluator annotation file', f'{sub}.ann_file', metric['ann_file']


def _pretrained_paths(node, key: str) -> Iterator[Tuple[str, str, str]]:
    """``init_cfg=dict(type='Pretrained', checkpoint=...)`` anywhere in the model config."""
    if isinstance(node, dict):
        kind = node.get('type')
        if (
            isinstance(kind, str)
            and kind.split('.')[-1] == 'Pretrained'
            and isinstance(node.get('checkpoint'), str)
        ):
            parts = key.split('.')
            owner = parts[1] if len(parts) > 2 and parts[1] != 'init_cfg' else 'model'
            yield f'{owner} pretrained checkpoint', f'{key}.checkpoint', node['checkpoint']
        for name, value in node.items():
            yield from _pretrained_paths(value, f'{key}.{name}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _pretrained_paths(value, f'{key}.{i}')


def _scales_paths(model) -> Iterator[Tuple[str, str, str]]:
    """RepOptVGG's ``scales`` file (read when the model is built, by every tool)."""
    backbone = (model or {}).get('backbone') or {}
    if isinstance(backbone, dict) and isinstance(backbone.get('scales'), str):
        yield ('Hyper-Search scales checkpoint', 'model.backbone.scales', backbone['scales'])


def _teacher_paths(model) -> Iterator[Tuple[str, str, str]]:
    """DistilledMAE's ``teacher_checkpoint`` (read when the model is built, by every tool)."""
    if isinstance(model, dict) and isinstance(model.get('teacher_checkpoint'), str):
        yield ('teacher checkpoint', 'model.teacher_checkpoint', model['teacher_checkpoint'])


def _coco_datasets(ds, key: str) -> Iterator[Tuple[str, dict]]:
    """(key, config) of the data sets under ``ds`` (wrappers followed) that are mmdet
    ``CocoDataset``s or subclasses (LVIS, Objects365, ...)."""
    if not isinstance(ds, dict):
        return
    if isinstance(ds.get('dataset'), dict):
        yield from _coco_datasets(ds['dataset'], f'{key}.dataset')
    for i, sub in enumerate(ds.get('datasets') or []):
        yield from _coco_datasets(sub, f'{key}.datasets.{i}')
    if 'mmdet' not in sys.modules:  # not a detection config: no need to import it
        return
    try:
        from mmdet.datasets import CocoDataset
        from mmdet.registry import DATASETS

        cls = DATASETS.get(ds.get('type') or '')
    except Exception:  # noqa: BLE001  a type mmdet lacks: the build will say so
        return
    if isinstance(cls, type) and issubclass(cls, CocoDataset):
        yield key, ds


def _category_names(path: str) -> Optional[List[str]]:
    """The category names of a COCO annotation file, in its order. Reads the file once but
    decodes its ``categories`` only (COCO's train set is 450 MB of JSON)."""
    with open(path, 'rb') as f:
        data = f.read()
    start = data.rfind(b'"categories"')
    try:
        text = data[data.index(b':', start) + 1 :].decode('utf-8').lstrip()
        categories, _ = json.JSONDecoder().raw_decode(text)
        return [c['name'] for c in categories]
    except (ValueError, TypeError, KeyError):  # no such key, or not at the top level
        categories = json.loads(data).get('categories')
        return [c['name'] for c in categories] if isinstance(categories, list) else None


def _class_problem(classes: Sequence[str], names: List[str], key: str, path: str) -> Optional[str]:
    """mmdet's CocoDataset keeps the file's categories named in ``classes`` and numbers them
    in the file's order: absent names empty the data set or shift the labels, another order
    swaps the names of the labels."""
    absent = [c for c in classes if c not in names]
    option = f'{key}.metainfo.classes'
    if len(absent) == len(classes):
        return (
            f'{option} {tuple(classes)} names none of the {len(names)} categories of '
            f'{path} ({", ".join(names[:12])}): the data set would be empty; use names '
            'from the annotation file'
        )
    if absent:
        hints = [
            f'{c!r} -> {difflib.get_close_matches(c, names, n=1)[0]!r}'
            for c in absent
            if difflib.get_close_matches(c, names, n=1)
        ]
        return (
            f'{option}: {", ".join(map(repr, absent))} not among the categories of {path}, '
            'so the labels after it would shift'
            + (f' (did you mean {", ".join(hints)}?)' if hints else '')
        )
    kept = [n for n in names if n in classes]
    if kept != list(classes):
        return (
            f"{option}: mmdet numbers the labels in the annotation file's order, so the "
            f'names would be swapped: give them as {tuple(kept)}'
        )
    return None


def class_filter_problems(cfg: Config, splits: Sequence[str]) -> List[str]:
    """One line per COCO-format data set of ``splits`` whose ``metainfo.classes`` does not fit
    its (local, existing) annotation file; see :func:`_class_problem`."""
    problems = []
    for split in splits:
        if not _split_configured(cfg, split):
            continue
        root = cfg[f'{split}_dataloader'].get('dataset')
        for key, ds in _coco_datasets(root, f'{split}_dataloader.dataset'):
            classes = (ds.get('metainfo') or {}).get('classes')
            path = next(
                (
                    p
                    for what, _, p in _dataset_paths(ds, key, split)
                    if what.endswith('annotation file')
                ),
                None,
            )
            if not classes or not path or not osp.isfile(path):
                continue
            names = _category_names(path)
            problem = names is not None and _class_problem(list(classes), names, key, path)
            if problem:
                problems.append(problem)
    return problems


def _split_configured(cfg: Config, split: str) -> bool:
    if not cfg.get(f'{split}_dataloader'):
        return False
    # mmengine's Runner validates only when all three are given
    return split != 'val' or (bool(cfg.get('val_cfg')) and cfg.get('val_evaluator') is not None)


def _config_paths(
    cfg: Config, splits: Sequence[str], pretrained: bool
) -> Iterator[Tuple[str, str, str]]:
    """(what, key, path) of the local paths the config makes a tool read: see
    :func:`find_missing_inputs`."""
    for split in splits:
        if not _split_configured(cfg, split):
            continue
        yield from _dataset_paths(
            cfg[f'{split}_dataloader'].get('dataset'), f'{split}_dataloader.dataset', split
        )
        yield from _evaluator_paths(cfg.get(f'{split}_evaluator'), f'{split}_evaluator', split)
    if pretrained:
        yield from _pretrained_paths(cfg.get('model'), 'model')
    yield from _scales_paths(cfg.get('model'))  # read when the model is built
    yield from _teacher_paths(cfg.get('model'))


def config_inputs(
    cfg: Config, splits: Sequence[str] = (), pretrained: bool = False
) -> List[Tuple[str, str]]:
    """``(what, path)`` of the config file and of the local files and folders it makes a tool
    read (the data of ``splits``, the backbone's ``scales`` file, with ``pretrained`` the
    ``Pretrained`` checkpoints; as :func:`find_missing_inputs` lists them): the inputs no
    output may replace (the tools' output guard, integrations/cli/outputs.py)."""
    found = [('config', cfg.filename)] if cfg.filename else []
    for what, _, path in _config_paths(cfg, splits, pretrained):
        if not is_remote(path):
            found.append((what, osp.expanduser(path) if what.endswith('checkpoint') else path))
    return found


def find_missing_inputs(
    cfg: Config,
    splits: Sequence[str] = (),
    pretrained: bool = False,
    checkpoints: Iterable[Tuple[str, str, Optional[str]]] = (),
) -> List[MissingInput]:
    """The local paths a tool will read that do not exist, each once, in config order.

    Args:
        cfg: the config, with the tool's overrides applied.
        splits: the data loaders the tool uses (``'train'``, ``'val'``, ``'test'``): data roots,
            annotation files, ``data_prefix`` directories and evaluator annotation files. A
            ``'val'`` or ``'test'`` split the config does not set up is skipped.
        pretrained: also the ``Pretrained`` ``init_cfg`` checkpoints in ``cfg.model`` (read by
            ``init_weights`` when training starts). A backbone's ``scales`` file (RepOptVGG)
            is always checked: building the model reads it.
        checkpoints: more ``(what, where it comes from, path)`` to check, e.g. ``load_from``;
            ``None`` paths are skipped.

    URLs (``http(s)://``, ``open-mmlab://``, ``torchvision://``, ...) are not checked.
    """
    found = list(_config_paths(cfg, splits, pretrained)) + [c for c in checkpoints if c[2]]
    missing, seen = [], set()
    for what, key, path in found:
        local = osp.expanduser(path) if what.endswith('checkpoint') else path
        if is_remote(path) or path in seen or osp.exists(local):
            continue
        seen.add(path)
        missing.append(MissingInput(what, key, path))
    return missing
