"""Own data for mmpretrain configs: a folder per class (see :mod:`mmrepa.datasets.own_data`)."""

import os
import os.path as osp
from typing import List

from mmengine.config import Config

from ...errors import ConfigError
from .common import loaders, split_names

CUSTOM_DATASET_KEYS = (
    'pipeline',
    'test_mode',
    'serialize_data',
    'lazy_init',
    'max_refetch',
    'indices',
    'backend_args',
)


def _class_folders(path: str) -> List[str]:
    return sorted(d for d in os.listdir(path) if osp.isdir(osp.join(path, d)))


def _check_entries_readable(folder: str) -> None:
    """Every entry under a split's folder can be looked at (mmpretrain's scan stops with a
    traceback at a link loop or a dangling link's ELOOP): one line naming the entry."""
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                os.stat(osp.join(top, name))
            except OSError as err:
                raise ConfigError(
                    f'--data-root: {osp.join(top, name)}: {err.strerror}; remove or fix it'
                ) from None


def classification(cfg: Config, root: str, classes, labelled: bool = True):
    """Point the loaders at a folder per class; ``labelled=False`` (self-supervised
    pre-training, a model without classes) reads the same images without labels."""
    if classes:
        raise ConfigError(
            '--classes: classification data names its classes by its folders (DIR/train/CLASS/...)'
        )
    names, found = None, []
    for loader, split, leaves in loaders(cfg):
        configured = [leaf.get('data_prefix') for leaf in leaves]
        configured = [p.get('img_path') if isinstance(p, dict) else p for p in configured]
        folder = next(
            (
                f
                for f in [split_names(split)[0], *configured, *split_names(split)[1:]]
                if isinstance(f, str)
                and f
                and osp.isdir(osp.join(root, f))
                and _class_folders(osp.join(root, f))
            ),
            None,
        )
        if folder is None:
            found.append(f'{split}: not found')
            folders = None
        else:
            _check_entries_readable(osp.join(root, folder))
            folders = _class_folders(osp.join(root, folder))
            if names is None:
                names = folders
            elif folders != names:
                missing = sorted(set(names) - set(folders))
                extra = sorted(set(folders) - set(names))
                raise ConfigError(
                    f'--data-root: {osp.join(root, folder)} has other class folders than the '
                    f'first split ({"missing " + ", ".join(missing) if missing else ""}'
                    f'{"; " if missing and extra else ""}'
                    f'{"extra " + ", ".join(extra) if extra else ""}): labels follow the sorted '
                    'folder names, so every split needs the same folders (an empty one is '
                    'enough)'
                )
            found.append(f'{split}: {folder}/')
        new = dict(
            type='CustomDataset',
            data_root=root,
            ann_file='',
            data_prefix=folder or (configured[0] if isinstance(configured[0], str) else split),
            with_label=labelled,
        )
        old = leaves[0]
        new.update({k: old[k] for k in CUSTOM_DATASET_KEYS if k in old})
        pipeline = list(new.get('pipeline') or [])
        if not any(
            isinstance(t, dict) and str(t.get('type', '')).startswith('LoadImage') for t in pipeline
        ):
            pipeline.insert(0, dict(type='LoadImageFromFile'))  # CIFAR's pipelines get arrays
        new['pipeline'] = pipeline
        if folders and labelled:
            new['metainfo'] = dict(classes=tuple(folders))
        cfg[loader]['dataset'] = new  # a wrapper of several data sets becomes one folder
    if names is None:
        raise ConfigError(
            f'--data-root: no class folders in {root}: expected '
            'train/CLASS/IMAGE and val/CLASS/IMAGE under it'
        )
    n = len(names)
    for key in ('val_evaluator', 'test_evaluator'):
        evaluator = cfg.get(key)
        for metric in evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]:
            _clip_topk(metric, n)
    _clip_topk((cfg.get('model') or {}).get('head'), n)
    return found, names


def _clip_topk(node, n: int) -> None:
    """Top-k accuracies for k up to the number of classes only (top-5 of 3 classes fails)."""
    if isinstance(node, dict) and node.get('topk') is not None:
        topk = node['topk'] if isinstance(node['topk'], (list, tuple)) else (node['topk'],)
        node['topk'] = tuple(k for k in topk if k <= n) or (1,)
