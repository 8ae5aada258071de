"""Own data for mmdet configs: COCO-format annotation files, validated entry by entry (see
:mod:`mmrepa.datasets.own_data`)."""

import collections
import copy
import json
import math
import os.path as osp
from typing import List

from mmengine.config import Config

from ...errors import ConfigError
from .common import first_existing, loaders, palette, split_names


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


def _is_id(value) -> bool:
    """A COCO id: an int or a str, not a bool (which json reads from true / false)."""
    return isinstance(value, (int, str)) and not isinstance(value, bool)


# what each entry of a COCO-format file must hold: (list, field, its check, what it must be)
_FIELDS = (
    ('categories', 'id', _is_id, 'an id'),
    ('categories', 'name', lambda v: isinstance(v, str) and v != '', 'a name'),
    ('images', 'id', _is_id, 'an id'),
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
    named = dict.fromkeys([stem, *split_names(split)])  # the test loader may read val.json
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


def detection(cfg: Config, root: str, classes):
    found, resolved, names = [], {}, None
    for loader, split, leaves in loaders(cfg):
        files = []
        for leaf in leaves:
            ann_file = _annotation_file(leaf, root, loader, split)
            if ann_file is None:
                continue
            if ann_file in files:
                raise ConfigError(
                    f'--data-root: {loader} has {len(leaves)} data sets and '
                    f'{ann_file} would serve two of them: give each its file '
                    f'with --cfg-options {loader}.dataset...ann_file=FILE'
                )
            files.append(ann_file)
            names = _use_coco_file(leaf, root, ann_file, split, names, classes)
        if files:
            resolved[split] = files[0]
        found.append(f'{split}: {" + ".join(files) if files else "not found"}')
    if names is None:
        raise ConfigError(
            f'--data-root: no COCO-format annotations in {root}: expected the '
            "config's ann_file, annotations/{train,val}.json or "
            'annotations/instances_{train,val}*.json under it'
        )
    meta = dict(classes=tuple(names), palette=palette(len(names)))
    for _, _, leaves in loaders(cfg):
        for leaf in leaves:
            leaf['metainfo'] = copy.deepcopy(meta)
    _point_evaluators(cfg, root, resolved)
    return found, names


def _annotation_file(leaf: dict, root: str, loader: str, split: str):
    """The split's own annotation file under ``root`` (or the config's), None if none."""
    if not str(leaf.get('ann_file', '')).endswith('.json'):
        raise ConfigError(
            f'--data-root reads COCO-format data; {loader} uses '
            f'{leaf.get("type")} with ann_file={leaf.get("ann_file")!r}'
        )
    configured = leaf['ann_file'] if not osp.isabs(leaf['ann_file']) else None
    own = [
        [f'annotations/{s}.json', f'annotations/instances_{s}*.json'] for s in split_names(split)
    ]
    candidates = [*own[0], configured, *(own[1] if len(own) > 1 else [])]
    ann_file = first_existing(root, candidates, 'annotation file', loader)
    leaf['data_root'] = root
    return ann_file


def _use_coco_file(leaf: dict, root: str, ann_file: str, split: str, names, classes):
    """Checks ``ann_file`` and points ``leaf`` at it and its images; returns the class names
    (the first file's, or ``names`` when already known)."""
    path = osp.join(root, ann_file)
    coco = _read_coco(path)
    names = names or _coco_classes(coco, classes, path)
    _check_coco(coco, names, path, split, classes is not None)
    prefix = _image_prefix(root, ann_file, split, (leaf.get('data_prefix') or {}).get('img'), coco)
    leaf['ann_file'] = ann_file
    leaf['data_prefix'] = dict(leaf.get('data_prefix') or {}, img=prefix)
    return names


def _point_evaluators(cfg: Config, root: str, resolved: dict) -> None:
    """The val and test evaluators read the annotation file their split uses."""
    for split in ('val', 'test'):
        ann_file = resolved.get(split) or resolved.get('val')
        evaluator = cfg.get(f'{split}_evaluator')
        metrics = evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]
        for metric in metrics:
            if isinstance(metric, dict) and 'ann_file' in metric and ann_file:
                metric['ann_file'] = osp.join(root, ann_file)


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
    image = images.get(ann.get('image_id')) if _is_id(ann.get('image_id')) else None
    if image is None or not _is_id(ann.get('category_id')) or ann['category_id'] not in kept:
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
