"""What the own-data rewriting of every format shares: the data loaders and the data sets
they read, the search for a split's files, the classes' palette and heads."""

import glob
import inspect
import os.path as osp
from typing import Iterator, List, Optional

from mmengine.config import Config

from ...errors import ConfigError

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
CLASSES_FILE = 'classes.txt'


def leaf_datasets(dataset) -> Iterator[dict]:
    """The data set configs that read files, inside RepeatDataset / ClassBalancedDataset /
    MultiImageMixDataset (``dataset``) and ConcatDataset (``datasets``)."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):
        yield from leaf_datasets(dataset['dataset'])
    elif isinstance(dataset.get('datasets'), (list, tuple)):
        for sub in dataset['datasets']:
            yield from leaf_datasets(sub)
    else:
        yield dataset


def loaders(cfg: Config) -> Iterator[tuple]:
    """(loader name, split, leaf data set configs) of the config's data loaders."""
    for name in LOADERS:
        loader = cfg.get(name)
        if isinstance(loader, dict):
            leaves = list(leaf_datasets(loader.get('dataset')))
            if leaves:
                yield name, name.split('_')[0], leaves


def split_names(split: str) -> tuple:
    return ('test', 'val') if split == 'test' else (split,)


def first_existing(root: str, candidates, what: str, loader: str) -> Optional[str]:
    """The first candidate (relative to ``root``; glob patterns allowed) that exists; a pattern
    matching several files is refused."""
    for candidate in candidates:
        if not candidate:
            continue
        matches = sorted(glob.glob(osp.join(root, candidate)))
        if len(matches) > 1:
            found = ', '.join(osp.relpath(m, root) for m in matches)
            raise ConfigError(
                f'--data-root {root}: several {what}s for {loader} ({found}): name '
                f'one with --cfg-options {loader}.dataset.ann_file=FILE'
            )
        if matches:
            return osp.relpath(matches[0], root)
    return None


def palette(n: int) -> list:
    """Colours for ``n`` new classes (the tools' fixed random palette)."""
    from ...apis import _random_palette

    return [tuple(c) for c in _random_palette(n)]  # mmdet draws tuples only


def has_num_classes(cfg: Config) -> bool:
    """Whether the model (or a top-level ``data_preprocessor``) sets a ``num_classes``."""

    def visit(node):
        if isinstance(node, dict):
            return 'num_classes' in node or any(visit(v) for v in node.values())
        return isinstance(node, (list, tuple)) and any(visit(v) for v in node)

    return visit(cfg.get('model')) or visit(cfg.get('data_preprocessor'))


def set_num_classes(cfg: Config, n: int) -> List[str]:
    """Set every ``num_classes`` of the model (and of a top-level ``data_preprocessor``, where
    mmpretrain configs keep it) to ``n``, except the RPN's (one class: object); returns the keys
    set. An mmseg head whose ``out_channels`` was its number of classes keeps it equal."""
    changed = []

    def visit(node, key):
        if isinstance(node, dict):
            if isinstance(node.get('num_classes'), int):
                old, node['num_classes'] = node['num_classes'], n
                if cfg.get('default_scope') == 'mmseg' and node.get('out_channels') == old:
                    node['out_channels'] = n
                changed.append(key)
            for k, v in node.items():
                if k != 'rpn_head':
                    visit(v, f'{key}.{k}')
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                visit(v, f'{key}.{i}')

    visit(cfg.get('model'), 'model')
    visit(cfg.get('data_preprocessor'), 'data_preprocessor')
    if not changed:
        raise ConfigError(
            f'--data-root: config {cfg.filename} has no num_classes in its model to set'
        )
    return changed


def registered_defaults(scope: str, dataset_type: str) -> dict:
    """The keyword defaults of a registered data set class (``{}`` if it is not found)."""
    import importlib

    try:
        cls = importlib.import_module(f'{scope}.registry').DATASETS.get(dataset_type)
    except Exception:  # noqa: BLE001  a scope or type that is not there
        cls = None
    if cls is None:
        return {}
    return {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
