"""Small generated data sets: coloured shapes on textured backgrounds, one per task family.

COCO, ImageNet and ADE20K are large downloads; these sets are generated in seconds and are
enough for a model to learn on a CPU in minutes, which is what ``make demo`` and the tests need.
Object colour is random, so a model has to tell circles, squares and triangles apart by shape.

- :func:`make_shapes_coco`: detection and instance segmentation, COCO format;
- :func:`make_shapes_classification`: one shape per image, a folder per class (mmpretrain's
  ``CustomDataset``);
- :func:`make_shapes_ade20k`: semantic segmentation in ADE20K's layout (mmseg's
  ``ADE20KDataset``; see :mod:`mmrepa.datasets.shapes_ade20k`).

Every generator is idempotent: an existing, complete set with the same parameters is left alone.
"""

import json
import math
import os
import os.path as osp
import shutil
from typing import Callable, List, NamedTuple, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ('circle', 'square', 'triangle')
# the semantic segmentation set labels the background too; ADE20K's label 0 ("other", ignored
# with reduce_zero_label) marks the shapes' one-pixel outlines, which belong to neither side
SEG_CLASSES = ('background',) + CLASSES
SEG_IGNORE = 0

# radius range as a fraction of the image side
MANY_RADIUS = (0.09, 0.22)
SINGLE_RADIUS = (0.2, 0.4)
SEG_RADIUS = (0.15, 0.3)


class Shape(NamedTuple):
    kind: str
    polygon: List[Tuple[float, float]]
    colour: Tuple[int, int, int]


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """Low-frequency colour gradient plus pixel noise, then a slight blur."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-60, 60, size=(2, 3))
    img = base + xx[..., None] * tilt[0] + yy[..., None] * tilt[1]
    img = img + rng.normal(0, 18, size=img.shape)
    img = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    return img.filter(ImageFilter.GaussianBlur(0.6))


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> List[Tuple[float, float]]:
    if kind == 'circle':
        n, offset = 32, 0.0
    elif kind == 'square':
        n, offset = 4, math.pi / 4
    else:
        n, offset = 3, -math.pi / 2
    return [
        (
            cx + r * math.cos(offset + angle + 2 * math.pi * i / n),
            cy + r * math.sin(offset + angle + 2 * math.pi * i / n),
        )
        for i in range(n)
    ]


def _draw_shapes(
    rng: np.random.Generator, size: int, max_objects: int, radius: Tuple[float, float] = MANY_RADIUS
) -> Tuple[Image.Image, List[Shape]]:
    """A background with 1 to ``max_objects`` shapes whose bounding squares do not overlap
    (fewer when no free place is found)."""
    img = _background(rng, size)
    draw = ImageDraw.Draw(img)
    boxes, shapes = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            r = rng.uniform(*radius) * size
            cx, cy = rng.uniform(r, size - r, size=2)
            box = (cx - r, cy - r, cx + r, cy + r)
            # keep objects apart so every box is clearly one shape
            if all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3] for b in boxes):
                break
        else:
            continue
        kind = CLASSES[int(rng.integers(len(CLASSES)))]
        angle = rng.uniform(-0.3, 0.3) if kind != 'circle' else 0.0
        poly = _polygon(kind, cx, cy, r, angle)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.polygon(poly, fill=colour, outline=(0, 0, 0))
        boxes.append(box)
        shapes.append(Shape(kind, poly, colour))
    return img, shapes


def _coco_object(shape: Shape, size: int) -> dict:
    xs, ys = [p[0] for p in shape.polygon], [p[1] for p in shape.polygon]
    x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
    x1, y1 = min(float(size), max(xs)), min(float(size), max(ys))
    return dict(
        category_id=CLASSES.index(shape.kind) + 1,
        bbox=[x0, y0, x1 - x0, y1 - y0],
        segmentation=[[c for p in shape.polygon for c in p]],
        area=_polygon_area(shape.polygon),
        iscrowd=0,
    )


def _polygon_area(poly) -> float:
    x = np.array([p[0] for p in poly])
    y = np.array([p[1] for p in poly])
    return float(0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def label_map(shapes: Sequence[Shape], size: int) -> np.ndarray:
    """ADE20K-style label map of drawn shapes: 1 + the index in :data:`SEG_CLASSES` per pixel
    (background 1), :data:`SEG_IGNORE` on the outlines; drawn as the image is drawn."""
    seg = Image.new('L', (size, size), 1 + SEG_CLASSES.index('background'))
    draw = ImageDraw.Draw(seg)
    for shape in shapes:
        draw.polygon(shape.polygon, fill=1 + SEG_CLASSES.index(shape.kind), outline=SEG_IGNORE)
    return np.asarray(seg)


def _generate(
    root: str, params: dict, subdirs: Sequence[str], write: Callable[[np.random.Generator], None]
) -> str:
    """Run ``write`` unless ``root`` holds a complete set made with ``params``.

    ``params.json`` is written last, so an interrupted run starts again; the set's own
    subdirectories are emptied first, since the folder layouts (mmpretrain's, ADE20K's) read
    every file there and a larger earlier set would leave extra images behind.
    """
    stamp = osp.join(root, 'params.json')
    if osp.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == params:
                return root
        os.remove(stamp)
    for sub in subdirs:
        shutil.rmtree(osp.join(root, sub), ignore_errors=True)
    os.makedirs(root, exist_ok=True)
    write(np.random.default_rng(params['seed']))
    with open(stamp, 'w') as f:
        json.dump(params, f)
    return root


def make_shapes_coco(
    root: str,
    num_train: int = 400,
    num_val: int = 80,
    size: int = 128,
    max_objects: int = 3,
    seed: int = 0,
) -> str:
    """Write ``{root}/{train,val}/*.png`` and ``{root}/annotations/{train,val}.json``.

    Every object has its box and its polygon (``segmentation``), so the set serves detection
    and instance segmentation. Idempotent. Returns ``root``.
    """
    params = dict(
        num_train=num_train, num_val=num_val, size=size, max_objects=max_objects, seed=seed
    )

    def write(rng):
        os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
        for split, count in (('train', num_train), ('val', num_val)):
            os.makedirs(osp.join(root, split), exist_ok=True)
            images, annotations = [], []
            for i in range(count):
                img, shapes = _draw_shapes(rng, size, max_objects)
                name = f'{i:05d}.png'
                img.save(osp.join(root, split, name))
                images.append(dict(id=i + 1, file_name=name, width=size, height=size))
                for shape in shapes:
                    annotations.append(
                        dict(_coco_object(shape, size), id=len(annotations) + 1, image_id=i + 1)
                    )
            coco = dict(
                images=images,
                annotations=annotations,
                categories=[dict(id=i + 1, name=c) for i, c in enumerate(CLASSES)],
            )
            with open(osp.join(root, 'annotations', f'{split}.json'), 'w') as f:
                json.dump(coco, f)

    return _generate(root, params, ('train', 'val', 'annotations'), write)


def make_shapes_classification(
    root: str, num_train: int = 3000, num_val: int = 300, size: int = 48, seed: int = 0
) -> str:
    """Write ``{root}/{train,val}/{circle,square,triangle}/*.png``: one shape per image.

    The folder-per-class layout of mmpretrain's ``CustomDataset`` (and torchvision's
    ``ImageFolder``); the folders sort in :data:`CLASSES` order, so label ``i`` is
    ``CLASSES[i]``. Idempotent. Returns ``root``.
    """
    params = dict(num_train=num_train, num_val=num_val, size=size, seed=seed)

    def write(rng):
        for split, count in (('train', num_train), ('val', num_val)):
            for kind in CLASSES:  # an empty class would shift the labels of the others
                os.makedirs(osp.join(root, split, kind), exist_ok=True)
            for i in range(count):
                # the shape is large and fits at once (nothing to avoid), so there is always one
                img, (shape,) = _draw_shapes(rng, size, 1, SINGLE_RADIUS)
                img.save(osp.join(root, split, shape.kind, f'{i:05d}.png'))

    return _generate(root, params, ('train', 'val'), write)


def make_shapes_ade20k(
    root: str,
    num_train: int = 1000,
    num_val: int = 100,
    size: int = 48,
    max_objects: int = 3,
    radius: Sequence[float] = SEG_RADIUS,
    seed: int = 0,
) -> str:
    """Write a semantic segmentation set in ADE20K's layout (``ADEChallengeData2016``).

    ``{root}/images/{training,validation}/*.jpg`` and
    ``{root}/annotations/{training,validation}/*.png`` (same stem): label ``1 + i`` for
    :data:`SEG_CLASSES` ``[i]`` (background 1), 0 on the shapes' outlines. As in ADE20K, 0 is
    ignored by ``reduce_zero_label=True``, which makes the background class 0. Idempotent.
    Returns ``root``.
    """
    params = dict(
        num_train=num_train,
        num_val=num_val,
        size=size,
        max_objects=max_objects,
        radius=list(radius),
        seed=seed,
    )  # a list, as JSON reads it back

    def write(rng):
        for split, count in (('training', num_train), ('validation', num_val)):
            os.makedirs(osp.join(root, 'images', split), exist_ok=True)
            os.makedirs(osp.join(root, 'annotations', split), exist_ok=True)
            for i in range(count):
                img, shapes = _draw_shapes(rng, size, max_objects, radius)
                name = f'shapes_{split}_{i:05d}'  # ADE_train_00000001 style
                img.save(osp.join(root, 'images', split, name + '.jpg'), quality=95)
                Image.fromarray(label_map(shapes, size)).save(
                    osp.join(root, 'annotations', split, name + '.png')
                )

    return _generate(root, params, ('images', 'annotations'), write)
