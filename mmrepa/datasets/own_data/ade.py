"""Own data for mmseg configs: ADE20K's layout of images and PNG label maps (see
:mod:`mmrepa.datasets.own_data`)."""

import collections
import os
import os.path as osp
from typing import List, Sequence

from mmengine.config import Config

from ...errors import ConfigError
from .common import CLASSES_FILE, IMAGE_EXTENSIONS, loaders, palette, registered_defaults

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


def segmentation(cfg: Config, root: str, classes):
    names = _segmentation_classes(root, classes)
    found, checked = [], False
    for _loader, split, leaves in loaders(cfg):
        for leaf in leaves:
            defaults = registered_defaults('mmseg', leaf.get('type', ''))
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
