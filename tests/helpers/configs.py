"""Configs for tests: the demo detector on generated shapes, tiny classifiers on generated
images, ``--cfg-options`` as mmengine reads them, and config parsing memoized per process."""

import os
import os.path as osp

import numpy as np
from mmengine.config import Config
from PIL import Image

from mmrepa.apis import build_model, load_config

from .paths import DEMO, ROOT


def shapes_cfg_options(data: str) -> list:
    """``--cfg-options`` that point the demo detector config at a generated shapes set in
    ``data`` (ending in '/'), without worker processes; an untrained detector still detects."""
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [
            f'{loader}.dataset.data_root={data}',
            f'{loader}.num_workers=0',
            f'{loader}.persistent_workers=False',
        ]
    for ev in ('val_evaluator', 'test_evaluator'):
        options.append(f'{ev}.ann_file={data}annotations/val.json')
    options.append('model.test_cfg.score_thr=0.0')
    return options


def demo_cfg(data_root, work_dir, **overrides):
    cfg = load_config(DEMO)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].num_workers = 0
        cfg[loader].persistent_workers = False
    cfg.train_dataloader.batch_size = 4
    for ev in ('val_evaluator', 'test_evaluator'):
        cfg[ev].ann_file = osp.join(data_root, 'annotations/val.json')
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=1)
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=0, deterministic=True)
    cfg.merge_from_dict(overrides)
    return cfg


CLASSES = 3  # of write_images' data set
ITERS = 4  # tiny_classifier_config's training


def write_images(root: str, count: int = 6) -> str:
    """``root/{train,val}/class_k/*.png``: the folder layout mmpretrain's CustomDataset reads."""
    rng = np.random.default_rng(0)
    for split in ('train', 'val'):
        for i in range(count):
            folder = osp.join(root, split, f'class_{i % CLASSES}')
            os.makedirs(folder, exist_ok=True)
            pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(osp.join(folder, f'{i}.png'))
    return root


def tiny_classifier_config(base: str, arch: dict, data: str, path: str) -> str:
    """A config that inherits ``configs/<base>`` with a tiny backbone, a few generated images,
    ``ITERS`` iterations and one checkpoint; everything else (recipe, hooks, sync_bn) as is."""
    cfg = Config.fromfile(osp.join(ROOT, 'configs', base))
    cfg.model.backbone.arch = arch
    tiny = build_model(cfg).backbone
    stage = tiny.out_indices[-1]
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=32),
        dict(type='PackInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=32),
        dict(type='CenterCrop', crop_size=32),
        dict(type='PackInputs'),
    ]

    def loader(split, steps):
        # training is by iteration: an InfiniteSampler, since mmengine's iteration loop pauses
        # each time another sampler's epoch ends (every iteration or two here; docs/speed.md)
        sampler = 'InfiniteSampler' if split == 'train' else 'DefaultSampler'
        return dict(
            _delete_=True,
            batch_size=4,
            num_workers=0,
            sampler=dict(type=sampler, shuffle=split == 'train'),
            dataset=dict(type='CustomDataset', data_root=data, data_prefix=split, pipeline=steps),
        )

    hooks = [
        dict(h, num_batches=2) if h['type'] == 'BNRecalibrationHook' else h
        for h in cfg.get('custom_hooks', [])
    ]
    overrides = dict(
        model=dict(
            backbone=dict(arch=dict(arch, _delete_=True)),
            head=dict(num_classes=CLASSES, in_channels=tiny.num_features[stage]),
        ),
        data_preprocessor=dict(num_classes=CLASSES),
        train_dataloader=loader('train', pipeline),
        val_dataloader=loader('val', test_pipeline),
        test_dataloader=loader('val', test_pipeline),
        val_evaluator=dict(type='Accuracy', topk=(1,)),
        test_evaluator=dict(type='Accuracy', topk=(1,)),
        train_cfg=dict(
            _delete_=True, type='IterBasedTrainLoop', max_iters=ITERS, val_interval=ITERS
        ),
        param_scheduler=[dict(type='ConstantLR', factor=1.0, by_epoch=False)],
        default_hooks=dict(
            checkpoint=dict(by_epoch=False, interval=ITERS), logger=dict(interval=1)
        ),
        custom_hooks=hooks,
        auto_scale_lr=dict(enable=False),
    )
    with open(path, 'w') as f:
        f.write(f'_base_ = {osp.join(ROOT, "configs", base)!r}\n')
        for key, value in overrides.items():
            f.write(f'{key} = {value!r}\n')
    return path


def _memoize_external_config_paths():
    """mmengine resolves a ``mmdet::``/``mmseg::``/... base config by parsing every metafile of
    the package's model index (thousands of YAML files) on every lookup, and a base
    config (no metafile entry) by catching the ValueError of that lookup. Both outcomes are the
    same each time within a run (the installed packages do not change): memoized in this
    process, the ValueError raised again (a new one, same message) for a name not in the index.
    In-process config loads (~100 in the test_configs_<group>.py files) read each package's
    index once."""
    from mmengine.config import config

    lookup = config._get_external_cfg_path
    if getattr(lookup, '_memoized', False):
        return
    outcomes = {}

    def memoized(package_path, cfg_file):
        key = (package_path, cfg_file)
        if key not in outcomes:
            try:
                outcomes[key] = (True, lookup(package_path, cfg_file))
            except ValueError as e:
                outcomes[key] = (False, str(e))
        ok, value = outcomes[key]
        if not ok:
            raise ValueError(value)
        return value

    memoized._memoized = True
    config._get_external_cfg_path = memoized


def _memoize_config_files():
    """``Config.fromfile`` parses a config and each of its bases (``mmdet::`` ones included)
    by executing a copy of each file, paid again on every load (the hostile-checkpoint tests
    alone load the demo config 115 times; docs/speed.md). The parse of a file is
    kept by its path and the environment, with the files it read (itself and its bases, each
    with its size, times and inode): a parse is used again only while none of them changed, and
    handed out as a deep copy, so a test that writes or appends to a config or one of its bases
    gets the new contents."""
    import copy

    from mmengine.config import Config

    parse = Config._file2dict
    if getattr(parse, '_memoized', False):
        return
    parsed = {}  # key -> (the files read with their stamps, the parse)
    reading = []  # the files of the parses under way, innermost last

    def stamp(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino

    def memoized(
        filename, use_predefined_variables=True, use_environment_variables=True, lazy_import=None
    ):
        path = osp.abspath(filename)
        flags = (use_predefined_variables, use_environment_variables, lazy_import)
        key = (path, flags, frozenset(os.environ.items()))
        hit = parsed.get(key)
        if hit is None or any(stamp(p) != s for p, s in hit[0].items()):
            files = {path: stamp(path)}
            reading.append(files)
            try:
                hit = parsed[key] = (files, parse(filename, *flags))
            finally:
                reading.pop()
        for outer in reading:  # a config being parsed depends on this base and its bases
            outer.update(hit[0])
        return copy.deepcopy(hit[1])

    memoized._memoized = True
    Config._file2dict = staticmethod(memoized)


def memoize_config_parsing():
    """Both memos above, in this process (the test workers; the FSDP launch's ranks)."""
    _memoize_external_config_paths()
    _memoize_config_files()


def parse_options(options):
    """``--cfg-options`` as mmengine's DictAction reads them."""
    import argparse

    from mmengine.config import DictAction

    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options
