"""A sample input for the tools that measure a model (``tools/benchmark.py``,
``tools/get_flops.py``): its size and one batch through the config's test pipeline."""

import argparse
import os
import tempfile

import mmcv
import numpy as np
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate


def add_shape_argument(parser: argparse.ArgumentParser) -> None:
    """``--shape H W``; ``None`` when not given: the tool then uses :func:`default_input_shape`."""
    parser.add_argument(
        '--shape',
        nargs=2,
        type=int,
        metavar=('H', 'W'),
        default=None,
        help='input size (default: 800 1333 for detection, 512 512 for '
        'segmentation, 224 224 for classification)',
    )


DEFAULT_INPUT_SHAPES = {'mmseg': (512, 512), 'mmpretrain': (224, 224)}


def default_input_shape(cfg: Config) -> tuple:
    """The (H, W) the tools measure a config's model at, unless told: the papers' sizes,
    512 x 512 for segmentation, 224 x 224 for classification (32 x 32 on CIFAR), 800 x 1333
    for detection."""
    dataset = ((cfg.get('train_dataloader') or {}).get('dataset') or {}).get('type', '')
    if cfg.get('default_scope') == 'mmpretrain' and str(dataset).startswith('CIFAR'):
        return (32, 32)
    return DEFAULT_INPUT_SHAPES.get(cfg.get('default_scope'), (800, 1333))


def pipeline_batch(cfg: Config, shape) -> dict:
    """A batch of one random ``shape`` (H, W) image through the config's test pipeline (its
    annotation loading left out), as the test dataloader would give it. A pipeline that loads
    no file (CIFAR: the data set holds the arrays) gets the image array itself."""
    steps = [
        t
        for t in cfg.test_dataloader.dataset.pipeline
        if not t['type'].startswith('LoadAnnotations')
    ]
    image = np.random.default_rng(0).integers(0, 256, size=(*shape, 3), dtype=np.uint8)
    results = dict(img_id=0, seg_fields=[], reduce_zero_label=False)
    if not any(t['type'].startswith('LoadImage') for t in steps):
        return pseudo_collate(
            [
                Compose(steps)(
                    dict(results, img=image, img_shape=tuple(shape), ori_shape=tuple(shape))
                )
            ]
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'image.png')
        mmcv.imwrite(image, path)
        data = Compose(steps)(dict(results, img_path=path))
    return pseudo_collate([data])
