"""Point a config at your own data in one step: ``--data-root DIR`` of the runner tools.

:func:`use_own_data` rewrites a config (in place, nothing is built) so that every data loader
reads DIR, the data sets and evaluators know DIR's classes, and every head predicts that many:

Each split is read from its own files first, then from the config's (under DIR); the test loader
then falls back to the val files (a data set without a test split tests on val).

- **mmdet configs, COCO format.** For each data loader the annotation file is the first found of
  ``DIR/annotations/{split}.json`` (what :func:`mmrepa.datasets.make_shapes_coco` writes),
  ``DIR/annotations/instances_{split}*.json`` (COCO's own layout), the config's ``ann_file``.
  The images are looked for in ``DIR/NAME/`` and ``DIR/images/NAME/`` for NAME the annotation
  file's name (``val`` of ``val.json``, ``train2017`` of ``instances_train2017.json``), the
  config's ``data_prefix.img``, the same two folders named after the split (``test``, then
  ``val``, for the test loader), ``DIR/images/`` and DIR. The classes are the
  training file's ``categories`` in their order (as mmdet numbers them); ``classes`` selects some
  of them. Set: ``data_root``, ``ann_file``, ``data_prefix.img`` and ``metainfo`` of every data
  set (inside RepeatDataset, ConcatDataset, ... too), the evaluators' ``ann_file`` and the
  ``num_classes`` of every head (RetinaNet's ``bbox_head``, Mask R-CNN's ``roi_head.bbox_head``
  and ``mask_head``, each of Cascade R-CNN's ``bbox_head``s; the RPN keeps its one class).
- **mmseg configs, ADE20K's layout**: ``DIR/images/{training,validation,testing}/`` and
  ``DIR/annotations/{training,validation,testing}/`` (PNG label maps, same file stems), or the
  config's ``data_prefix`` under DIR. Label maps hold no names: the classes are ``classes``
  (``--classes a,b,c``), else the lines of ``DIR/classes.txt``. Label values are read as the
  config's data set reads them: ADE20K's ``reduce_zero_label`` (0 ignored, value ``k`` is the
  ``k``-th class of the list) unless the config says otherwise; 255 is ignored. The data sets
  become mmseg's ``BaseSegDataset`` (ADE20KDataset refuses classes that are not ADE20K's) with the
  config's suffixes; the image suffix follows the files. Set: the data sets, the ``num_classes``
  of ``decode_head`` and ``auxiliary_head``.
- **mmpretrain configs, a folder per class**: ``DIR/{train,val,test}/CLASS/*.jpg`` (the test
  loader falls back to ``val``), mmpretrain's ``CustomDataset``; the classes are the folder names
  of ``train`` in sorted order, and every split must have the same folders (an empty one is
  enough). Set: the data sets, the ``num_classes`` of the head and data preprocessor, top-k
  accuracies above the number of classes dropped.

A loader whose data is not found under DIR keeps the config's paths, now under DIR, so that the
tool's input check names what is missing. Apply ``--cfg-options`` first: the file names it sets
are searched for under DIR.
"""

import collections
import copy
import glob
import inspect
import json
import math
import os
import os.path as osp
from typing import Iterator, List, Optional, Sequence

from mmengine.config import Config

from ...errors import ConfigError

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
CLASSES_FILE = 'classes.txt'


def use_own_data(cfg: Config, data_root: str, classes: Optional[Sequence[str]] = None) -> str:
    """Rewrite ``cfg`` in place to train and test on the data in ``data_root`` (see the module's
    documentation for the layouts); returns a line saying what was found. ``classes``: the
    class names (mmseg), or the categories to keep (mmdet). Raises
    :class:`~mmrepa.errors.ConfigError` with the reason when the data cannot serve the config."""
    if not osp.isdir(data_root):
        raise FileNotFoundError(f'--data-root {data_root}: no such directory')
    scope = cfg.get('default_scope')
    rewrite = {'mmdet': _detection, 'mmseg': _segmentation, 'mmpretrain': _classification}.get(
        scope
    )
    if rewrite is None:
        raise ConfigError(
            f'--data-root: config {cfg.filename} has default_scope {scope!r}; '
            'it knows mmdet, mmseg and mmpretrain configs'
        )
    classes = [c.strip() for c in classes if c.strip()] if classes else None
    root = osp.join(data_root, '')  # mmengine joins data_root and the prefixes as strings
    for name in LOADERS:  # test_dataloader = val_dataloader in a config is one object
        if isinstance(cfg.get(name), dict):
            cfg[name] = copy.deepcopy(cfg[name])
    if 'data_root' in cfg:
        cfg.data_root = root
    found, names = rewrite(cfg, root, classes)
    if isinstance(cfg.get('metainfo'), dict):  # the configs' variable: as the data sets have it
        cfg.metainfo = dict(classes=tuple(names), palette=palette(len(names)))
    heads = set_num_classes(cfg, len(names))
    listed = ', '.join(names[:8]) + (f', ... ({len(names)})' if len(names) > 8 else '')
    return (
        f'--data-root {data_root}: {len(names)} classes ({listed}); '
        + '; '.join(found)
        + f'; num_classes={len(names)} in '
        + ', '.join(heads)
    )


# ---------------------------------------------------------------------------------- helpers


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


def _loaders(cfg: Config) -> Iterator[tuple]:
    """(loader name, split, leaf data set configs) of the config's data loaders."""
    for name in LOADERS:
        loader = cfg.get(name)
        if isinstance(loader, dict):
            leaves = list(leaf_datasets(loader.get('dataset')))
            if leaves:
                yield name, name.split('_')[0], leaves


def _splits(split: str) -> tuple:
    return ('test', 'val') if split == 'test' else (split,)


def _first_existing(root: str, candidates, what: str, loader: str) -> Optional[str]:
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


def _registered_defaults(scope: str, dataset_type: str) -> dict:
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


# ------------------------------------------------------------------------------ detection


def _read_coco(path: str) -> dict:
    try:
        with open(path, encoding='utf-8') as f:
            coco = json.load(f)
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        reason = 'nested deeper than Python parses' if isinstance(err, RecursionError) else err
        raise ConfigError(
            f'--data-root: cannot read {path} as COCO-format JSON: {reason}'
        ) from None
    if not isinstance(coco, dict) or not coco.get('categories') or not coco.get('images'):
        raise ConfigError(
            f'--data-root: {path} is not a COCO-format annotation file with images and categories'
        )
    _check_entries(coco, path)
    return coco


# what each entry of a COCO-format file must hold: (list, field, its check, what it must be)
_FIELDS = (
    ('categories', 'id', lambda v: isinstance(v, (int, str)) and not isinstance(v, bool), 'an id'),
    ('categories', 'name', lambda v: isinstance(v, str) and v != '', 'a name'),
    ('images', 'id', lambda v: isinstance(v, (int, str)) and not isinstance(v, bool), 'an id'),
    ('images', 'file_name', lambda v: isinstance(v, str) and v != '', 'a file name'),
)


def _check_entries(coco: dict, path: str) -> None:
    """Every category and image a dict with its fields, unique category ids, every box four
    finite numbers of positive width and height: one line naming the entry and the field."""
    for key in ('categories', 'images', 'annotations'):
        if key in coco and not isinstance(coco[key], list):
            raise ConfigError(
                f'--data-root: {path}: {key} is a {type(coco[key]).__name__}, not a list'
            )
    for key, field, ok, what in _FIELDS:
        for i, entry in enumerate(coco[key]):
            if not isinstance(entry, dict) or not ok(entry.get(field)):
                found = repr(entry.get(field) if isinstance(entry, dict) else entry)[:60]
                raise ConfigError(
                    f'--data-root: {path}: {key}[{i}].{field} must be {what}, not {found}'
                )
    seen = {}
    for i, category in enumerate(coco['categories']):
        if category['id'] in seen:
            raise ConfigError(
                f'--data-root: {path}: categories[{seen[category["id"]]}] and categories[{i}] '
                f'share the id {category["id"]!r}: each category needs its own'
            )
        seen[category['id']] = i
    for i, ann in enumerate(coco.get('annotations') or ()):
        box = ann.get('bbox') if isinstance(ann, dict) else None
        numbers = isinstance(box, list) and len(box) == 4 and all(_finite(v) for v in box)
        if not (numbers and box[2] > 0 and box[3] > 0):
            raise ConfigError(
                f'--data-root: {path}: annotations[{i}].bbox must be [x, y, width, height] '
                f'with a positive width and height, not {repr(box)[:60]}'
            )


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _image_prefix(root: str, ann_file: str, split: str, configured, coco: dict) -> str:
    """The folder (relative to ``root``) holding the first image of ``coco``."""
    first = coco['images'][0]['file_name']
    stem = osp.splitext(osp.basename(ann_file))[0]
    stem = stem[len('instances_') :] if stem.startswith('instances_') else stem
    named = dict.fromkeys([stem, *_splits(split)])  # the test loader may read val.json
    own = [f'{p}{n}/' for n in named for p in ('', 'images/')]
    candidates = [*own[:2], configured, *own[2:], 'images/', '']
    for prefix in candidates:
        if isinstance(prefix, str) and osp.isfile(osp.join(root, prefix, first)):
            return prefix
    looked = ', '.join(
        osp.join(root, p) for p in dict.fromkeys(p for p in candidates if isinstance(p, str))
    )
    raise ConfigError(
        f'--data-root: the images of {osp.join(root, ann_file)} were not found: '
        f'looked for {first} in {looked}'
    )


def _detection(cfg: Config, root: str, classes):
    found, resolved, names = [], {}, None
    for loader, split, leaves in _loaders(cfg):
        files = []
        for leaf in leaves:
            if not str(leaf.get('ann_file', '')).endswith('.json'):
                raise ConfigError(
                    f'--data-root reads COCO-format data; {loader} uses '
                    f'{leaf.get("type")} with ann_file={leaf.get("ann_file")!r}'
                )
            configured = leaf['ann_file'] if not osp.isabs(leaf['ann_file']) else None
            splits = _splits(split)
            own = [[f'annotations/{s}.json', f'annotations/instances_{s}*.json'] for s in splits]
            candidates = [*own[0], configured, *(own[1] if len(own) > 1 else [])]
            ann_file = _first_existing(root, candidates, 'annotation file', loader)
            leaf['data_root'] = root
            if ann_file is None:
                continue
            if ann_file in files:
                raise ConfigError(
                    f'--data-root: {loader} has {len(leaves)} data sets and '
                    f'{ann_file} would serve two of them: give each its file '
                    f'with --cfg-options {loader}.dataset...ann_file=FILE'
                )
            files.append(ann_file)
            coco = _read_coco(osp.join(root, ann_file))
            names = names or _coco_classes(coco, classes, osp.join(root, ann_file))
            _check_coco(coco, names, osp.join(root, ann_file), split, classes is not None)
            prefix = _image_prefix(
                root, ann_file, split, (leaf.get('data_prefix') or {}).get('img'), coco
            )
            leaf['ann_file'] = ann_file
            leaf['data_prefix'] = dict(leaf.get('data_prefix') or {}, img=prefix)
        if files:
            resolved[split] = files[0]
            found.append(f'{split}: {" + ".join(files)}')
        else:
            found.append(f'{split}: not found')
    if names is None:
        raise ConfigError(
            f'--data-root: no COCO-format annotations in {root}: expected the '
            "config's ann_file, annotations/{train,val}.json or "
            'annotations/instances_{train,val}*.json under it'
        )
    meta = dict(classes=tuple(names), palette=palette(len(names)))
    for _, _, leaves in _loaders(cfg):
        for leaf in leaves:
            leaf['metainfo'] = copy.deepcopy(meta)
    for split in ('val', 'test'):
        ann_file = resolved.get(split) or resolved.get('val')
        evaluator = cfg.get(f'{split}_evaluator')
        metrics = evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]
        for metric in metrics:
            if isinstance(metric, dict) and 'ann_file' in metric and ann_file:
                metric['ann_file'] = osp.join(root, ann_file)
    return found, names


def _coco_classes(coco: dict, classes, path: str) -> List[str]:
    """The category names in the file's order (mmdet's label order); ``classes``: a subset."""
    names = [c['name'] for c in coco['categories']]
    duplicated = sorted(n for n, k in collections.Counter(names).items() if k > 1)
    if duplicated:
        raise ConfigError(
            f'--data-root: {path} names several categories '
            f'{", ".join(duplicated)}: mmdet tells classes apart by name'
        )
    if classes:
        unknown = [c for c in classes if c not in names]
        if unknown:
            raise ConfigError(
                f'--classes {", ".join(unknown)}: not a category of {path} ({", ".join(names)})'
            )
        names = [n for n in names if n in classes]  # mmdet numbers them in the file's order
    return names


def _check_coco(coco: dict, names, path: str, split: str, selected: bool) -> None:
    """Refuse a file whose categories the model cannot predict, or that leaves its split with
    no object mmdet keeps (training: mmdet would fail deep inside with 'need at least one array
    to concatenate'; val and test: nothing to score)."""
    ids = {c['id']: c['name'] for c in coco['categories']}
    if not selected:
        extra = sorted(set(ids.values()) - set(names))
        if extra:
            raise ConfigError(
                f'--data-root: {path} has categories the training annotations '
                f'have not ({", ".join(extra)}); the model could not predict them'
            )
    kept = {i for i, n in ids.items() if n in names}
    images = {image['id']: image for image in coco['images']}
    if not any(_usable(a, images, kept) for a in coco.get('annotations') or ()):
        verb = 'train on' if split == 'train' else 'test on'
        raise ConfigError(
            f'--data-root: {path} has no object of the classes {", ".join(names)}: nothing to '
            f'{verb} in the {split} split (mmdet keeps boxes of a pixel or more, inside a listed '
            'image, not crowds)'
        )


def _usable(ann: dict, images: dict, kept: set) -> bool:
    """Whether mmdet's CocoDataset keeps ``ann`` as an object to learn or score (its
    ``parse_data_info``: inside its image, at least a pixel wide and high, positive area, of a
    kept category; crowds are ignored)."""
    image = images.get(ann.get('image_id')) if _hashable(ann.get('image_id')) else None
    if image is None or not _hashable(ann.get('category_id')) or ann['category_id'] not in kept:
        return False
    x, y, w, h = ann['bbox']
    area = ann.get('area', w * h)
    if (
        ann.get('iscrowd')
        or ann.get('ignore')
        or w < 1
        or h < 1
        or not (_finite(area) and area > 0)
    ):
        return False
    width, height = image.get('width'), image.get('height')
    if _finite(width) and _finite(height):  # mmdet drops a box with no overlap with its image
        return min(x + w, width) > max(x, 0) and min(y + h, height) > max(y, 0)
    return True


def _hashable(value) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


# --------------------------------------------------------------------------- segmentation

ADE_SPLITS = {'train': ('training',), 'val': ('validation',), 'test': ('testing', 'validation')}


def _files(folder: str) -> List[str]:
    return (
        sorted(f for f in os.listdir(folder) if osp.isfile(osp.join(folder, f)))
        if osp.isdir(folder)
        else []
    )


def _segmentation_classes(root: str, classes) -> List[str]:
    if classes:
        return list(classes)
    path = osp.join(root, CLASSES_FILE)
    if not osp.isfile(path):
        raise ConfigError(
            f'--data-root: segmentation label maps hold no class names: pass '
            f'--classes a,b,c or write {path} (one name a line, the class of '
            'label value 1 first for ADE20K-style maps, where 0 is ignored)'
        )
    try:
        with open(path, encoding='utf-8') as f:
            names = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as err:
        raise ConfigError(
            f'--data-root: {path} is not UTF-8 text (byte {err.start}): save the class names '
            'as UTF-8, one a line'
        ) from None
    if not names:
        raise ConfigError(f'--data-root: {path} names no class')
    return names


def _suffix(files: Sequence[str], configured: str, path: str) -> str:
    """``configured`` if some file ends with it, else the most common image extension."""
    if any(f.endswith(configured) for f in files):
        return configured
    found = collections.Counter(
        osp.splitext(f)[1].lower() for f in files if osp.splitext(f)[1].lower() in IMAGE_EXTENSIONS
    )
    if not found:
        raise ConfigError(f'--data-root: no image in {path}')
    ext = found.most_common(1)[0][0]
    return next(osp.splitext(f)[1] for f in files if osp.splitext(f)[1].lower() == ext)


def _image_size(path: str) -> tuple:
    """The size of an image file from its header (nothing decoded); one line if it is none, or
    larger than PIL decodes (its decompression-bomb limit)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.size
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise ConfigError(f'--data-root: {path} is not an image PIL reads ({err})') from None


def _check_labels(
    folder: str, files: Sequence[str], n: int, reduce_zero_label: bool, ignore_index: int
) -> None:
    """Refuse label maps with values past the classes (a class list too short), on a sample."""
    import numpy as np
    from PIL import Image

    top = n if reduce_zero_label else n - 1
    for name in files[:20]:
        values = np.unique(np.asarray(Image.open(osp.join(folder, name))))
        values = values[values != ignore_index]
        if values.size and int(values.max()) > top:
            rule = (
                'value k is class k-1, 0 is ignored' if reduce_zero_label else 'value k is class k'
            )
            raise ConfigError(
                f'--data-root: {osp.join(folder, name)} has label value '
                f'{int(values.max())} but {n} classes were given ({rule}, '
                f'{ignore_index} is ignored): name them all'
            )


def _segmentation(cfg: Config, root: str, classes):
    names = _segmentation_classes(root, classes)
    found, checked = [], False
    for _loader, split, leaves in _loaders(cfg):
        for leaf in leaves:
            defaults = _registered_defaults('mmseg', leaf.get('type', ''))
            settings = {
                k: leaf.get(k, defaults.get(k, fallback))
                for k, fallback in (
                    ('img_suffix', '.jpg'),
                    ('seg_map_suffix', '.png'),
                    ('reduce_zero_label', False),
                    ('ignore_index', 255),
                )
            }
            configured = dict(leaf.get('data_prefix') or {})
            own = [(f'images/{s}', f'annotations/{s}') for s in ADE_SPLITS[split]]
            candidates = [own[0], (configured.get('img_path'), configured.get('seg_map_path'))]
            candidates += own[1:]
            pair = next(
                (
                    (i, a)
                    for i, a in candidates
                    if isinstance(i, str)
                    and isinstance(a, str)
                    and _files(osp.join(root, i))
                    and _files(osp.join(root, a))
                ),
                None,
            )
            leaf.update(
                type='BaseSegDataset',
                data_root=root,
                metainfo=dict(classes=tuple(names), palette=palette(len(names))),
                reduce_zero_label=settings['reduce_zero_label'],
            )
            if pair is None:
                found.append(f'{split}: not found')
                continue
            images, labels = (_files(osp.join(root, p)) for p in pair)
            for folder, listed in zip(pair, (images, labels)):  # headers only: cheap
                for name in (n for n in listed if n.lower().endswith(IMAGE_EXTENSIONS)):
                    _image_size(osp.join(root, folder, name))  # not an image: here, not later
            settings['img_suffix'] = _suffix(
                images, settings['img_suffix'], osp.join(root, pair[0])
            )
            if not any(f.endswith(settings['seg_map_suffix']) for f in labels):
                raise ConfigError(
                    f'--data-root: no label map ending in '
                    f'{settings["seg_map_suffix"]} in {osp.join(root, pair[1])}'
                )
            if not checked:
                _check_labels(
                    osp.join(root, pair[1]),
                    [f for f in labels if f.endswith(settings['seg_map_suffix'])],
                    len(names),
                    settings['reduce_zero_label'],
                    settings['ignore_index'],
                )
                checked = True
            leaf.update(
                settings, data_prefix=dict(configured, img_path=pair[0], seg_map_path=pair[1])
            )
            found.append(f'{split}: {pair[0]} + {pair[1]}')
    return found, names


# ------------------------------------------------------------------------- classification

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


def _classification(cfg: Config, root: str, classes):
    if classes:
        raise ConfigError(
            '--classes: classification data names its classes by its folders (DIR/train/CLASS/...)'
        )
    names, found = None, []
    for loader, split, leaves in _loaders(cfg):
        configured = [leaf.get('data_prefix') for leaf in leaves]
        configured = [p.get('img_path') if isinstance(p, dict) else p for p in configured]
        folder = next(
            (
                f
                for f in [_splits(split)[0], *configured, *_splits(split)[1:]]
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
            with_label=True,
        )
        old = leaves[0]
        new.update({k: old[k] for k in CUSTOM_DATASET_KEYS if k in old})
        pipeline = list(new.get('pipeline') or [])
        if not any(
            isinstance(t, dict) and str(t.get('type', '')).startswith('LoadImage') for t in pipeline
        ):
            pipeline.insert(0, dict(type='LoadImageFromFile'))  # CIFAR's pipelines get arrays
        new['pipeline'] = pipeline
        if folders:
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
