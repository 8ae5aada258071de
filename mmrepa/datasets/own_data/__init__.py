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
  accuracies above the number of classes dropped. A model without classes (self-supervised
  pre-training: D-MAE) reads the same folders' images without labels.

A loader whose data is not found under DIR keeps the config's paths, now under DIR, so that the
tool's input check names what is missing. Apply ``--cfg-options`` first: the file names it sets
are searched for under DIR.

One module per format (:mod:`.coco`, :mod:`.ade`, :mod:`.folder`) and what they share
(:mod:`.common`); the tools reach this through ``--data-root``
(:func:`mmrepa.integrations.cli.args.tool_config`).
"""

import copy
import os.path as osp
from typing import Optional, Sequence

from mmengine.config import Config

from ...errors import ConfigError
from .ade import segmentation
from .coco import detection
from .common import LOADERS, has_num_classes, palette, set_num_classes
from .folder import classification

__all__ = ['use_own_data']


def use_own_data(cfg: Config, data_root: str, classes: Optional[Sequence[str]] = None) -> str:
    """Rewrite ``cfg`` in place to train and test on the data in ``data_root`` (see the module's
    documentation for the layouts); returns a line saying what was found. ``classes``: the
    class names (mmseg), or the categories to keep (mmdet). Raises
    :class:`~mmrepa.errors.ConfigError` with the reason when the data cannot serve the config."""
    if not osp.isdir(data_root):
        raise FileNotFoundError(f'--data-root {data_root}: no such directory')
    scope = cfg.get('default_scope')
    rewrite = {'mmdet': detection, 'mmseg': segmentation, 'mmpretrain': classification}.get(scope)
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
    if scope == 'mmpretrain' and not has_num_classes(cfg):  # self-supervised: images only
        found, names = classification(cfg, root, classes, labelled=False)
        return (
            f'--data-root {data_root}: the images of {len(names)} class folders, without '
            f'labels (the model has no classes); ' + '; '.join(found)
        )
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
