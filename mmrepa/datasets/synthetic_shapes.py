"""A small detection data set in COCO format: coloured shapes on textured backgrounds.

COCO and ADE20K are large downloads; this set is generated in seconds and is enough for a
detector to learn on a CPU in minutes, which is what ``make demo`` and the tests need. Object
colour is random, so a detector has to tell circles, squares and triangles apart by shape.
"""
import json
import math
import os
import os.path as osp
from typing import List, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ('circle', 'square', 'triangle')


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
    return [(cx + r * math.cos(offset + angle + 2 * math.pi * i / n),
             cy + r * math.sin(offset + angle + 2 * math.pi * i / n)) for i in range(n)]


def _make_image(rng: np.random.Generator, size: int, max_objects: int):
    img = _background(rng, size)
    draw = ImageDraw.Draw(img)
    boxes = []
    objects = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            r = rng.uniform(0.09, 0.22) * size
            cx, cy = rng.uniform(r, size - r, size=2)
            box = (cx - r, cy - r, cx + r, cy + r)
            # keep objects apart so every box is clearly one shape
            if all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3]
                   for b in boxes):
                break
        else:
            continue
        kind = CLASSES[int(rng.integers(len(CLASSES)))]
        angle = rng.uniform(-0.3, 0.3) if kind != 'circle' else 0.0
        poly = _polygon(kind, cx, cy, r, angle)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.polygon(poly, fill=colour, outline=(0, 0, 0))
        xs, ys = [p[0] for p in poly], [p[1] for p in poly]
        x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
        x1, y1 = min(float(size), max(xs)), min(float(size), max(ys))
        boxes.append(box)
        objects.append(dict(category_id=CLASSES.index(kind) + 1,
                            bbox=[x0, y0, x1 - x0, y1 - y0],
                            segmentation=[[c for p in poly for c in p]],
                            area=_polygon_area(poly), iscrowd=0))
    return img, objects


def _polygon_area(poly) -> float:
    x = np.array([p[0] for p in poly])
    y = np.array([p[1] for p in poly])
    return float(0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def make_shapes_coco(root: str, num_train: int = 400, num_val: int = 80, size: int = 128,
                     max_objects: int = 3, seed: int = 0) -> str:
    """Write ``{root}/{train,val}/*.png`` and ``{root}/annotations/{train,val}.json``.

    Idempotent: an existing, complete set with the same parameters is left alone.
    Returns ``root``.
    """
    params = dict(num_train=num_train, num_val=num_val, size=size, max_objects=max_objects,
                  seed=seed)
    stamp = osp.join(root, 'params.json')
    if osp.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == params:
                return root
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    for split, count in (('train', num_train), ('val', num_val)):
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, annotations = [], []
        for i in range(count):
            img, objects = _make_image(rng, size, max_objects)
            name = f'{i:05d}.png'
            img.save(osp.join(root, split, name))
            images.append(dict(id=i + 1, file_name=name, width=size, height=size))
            for obj in objects:
                annotations.append(dict(obj, id=len(annotations) + 1, image_id=i + 1))
        coco = dict(images=images, annotations=annotations,
                    categories=[dict(id=i + 1, name=c) for i, c in enumerate(CLASSES)])
        with open(osp.join(root, 'annotations', f'{split}.json'), 'w') as f:
            json.dump(coco, f)
    with open(stamp, 'w') as f:
        json.dump(params, f)
    return root
