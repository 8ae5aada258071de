"""The check of the keys the Runner turns into arguments of its loops, data loaders, optimizer,
schedulers, hooks and evaluators (mmrepa/config/key_checks.py; issue 37, point 4)."""

import glob
import os.path as osp

import pytest
from mmengine.config import Config

from mmrepa.apis import load_config
from mmrepa.config.key_checks import accepted_keys, check_keys, key_problems
from mmrepa.errors import ConfigError
from tests.helpers import DEMO, ROOT

LOADER = dict(
    batch_size=2,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='CocoDataset', data_root='data/', ann_file='a.json', pipeline=[]),
)


def problems(scope='mmdet', **parts):
    return key_problems(Config(dict(default_scope=scope, **parts)))


@pytest.mark.parametrize(
    'parts, expected',
    [
        (
            dict(train_cfg=dict(by_epoch=True, max_epoch=3)),  # no type: Runner's by_epoch form
            "train_cfg.max_epoch: EpochBasedTrainLoop takes no argument 'max_epoch': did you "
            "mean 'max_epochs'?",
        ),
        (
            dict(train_cfg=dict(by_epoch=False, max_iter=3)),
            "train_cfg.max_iter: IterBasedTrainLoop takes no argument 'max_iter': did you mean "
            "'max_iters'?",
        ),
        (
            dict(val_cfg=dict(fp61=True)),
            "val_cfg.fp61: ValLoop takes no argument 'fp61': did you mean 'fp16'?",
        ),
        (
            dict(test_cfg=dict(type='TestLoop', fp_16=True)),
            "test_cfg.fp_16: TestLoop takes no argument 'fp_16': did you mean 'fp16'?",
        ),
        (
            dict(val_dataloader=dict(LOADER, drop_lst=True)),
            "val_dataloader.drop_lst: DataLoader takes no argument 'drop_lst': did you mean "
            "'drop_last'?",
        ),
        (
            dict(test_dataloader=dict(LOADER, sampler=dict(type='DefaultSampler', round=1))),
            "test_dataloader.sampler.round: DefaultSampler takes no argument 'round': did you "
            "mean 'round_up'?",
        ),
        (
            dict(train_dataloader=dict(LOADER, collate_fn=dict(type='pseudo_collate', batch=1))),
            "train_dataloader.collate_fn.batch: pseudo_collate takes no argument 'batch': did "
            "you mean 'data_batch'?",
        ),
        (  # CocoDataset(**kwargs) -> BaseDetDataset(**kwargs) -> BaseDataset
            dict(train_dataloader=dict(LOADER, dataset=dict(LOADER['dataset'], data_rot='d/'))),
            "train_dataloader.dataset.data_rot: CocoDataset takes no argument 'data_rot': did "
            "you mean 'data_root'?",
        ),
        (
            dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, weight_decy=1e-4))),
            "optim_wrapper.optimizer.weight_decy: SGD takes no argument 'weight_decy': did you "
            "mean 'weight_decay'?",
        ),
        (
            dict(optim_wrapper=dict(type='AmpOptimWrapper', optimizer=dict(type='SGD'), clip=1)),
            "optim_wrapper.clip: AmpOptimWrapper takes no argument 'clip': did you mean "
            "'clip_grad'?",
        ),
        (
            dict(param_scheduler=[dict(type='LinearLR'), dict(type='MultiStepLR', milestone=[8])]),
            "param_scheduler.1.milestone: MultiStepLR takes no argument 'milestone': did you "
            "mean 'milestones'?",
        ),
        (
            dict(default_hooks=dict(logger=dict(type='LoggerHook', interval=5, out_dir2='x'))),
            "default_hooks.logger.out_dir2: LoggerHook takes no argument 'out_dir2': did you "
            "mean 'out_dir'?",
        ),
        (
            dict(custom_hooks=[dict(type='EMAHook'), dict(type='EmptyCacheHook', befor_epoch=1)]),
            "custom_hooks.1.befor_epoch: EmptyCacheHook takes no argument 'befor_epoch': did "
            "you mean 'before_epoch'?",
        ),
        (
            dict(val_evaluator=dict(type='CocoMetric', metric='bbox', claswise=True)),
            "val_evaluator.claswise: CocoMetric takes no argument 'claswise': did you mean "
            "'classwise'?",
        ),
        (
            dict(test_evaluator=dict(metrics=[dict(type='VOCMetric', eval_mod='area')])),
            "test_evaluator.metrics.0.eval_mod: VOCMetric takes no argument 'eval_mod': did you "
            "mean 'eval_mode'?",
        ),
    ],
)
def test_a_key_that_no_runner_part_takes_is_named_with_the_closest(parts, expected):
    assert problems(**parts) == [expected]


def test_a_wrapped_data_set_is_checked_in_the_wrappers_scope():
    coco = dict(type='CocoDataset', ann_file='a.json', filter_cfgg=None)
    dataset = dict(type='RepeatDataset', _scope_='mmdet', times=2, dataset=coco)
    loader = dict(LOADER, dataset=dict(type='ConcatDataset', datasets=[dataset], lazy_init=True))
    assert problems(scope='mmengine', train_dataloader=loader) == [
        'train_dataloader.dataset.datasets.0.dataset.filter_cfgg: CocoDataset takes no argument '
        "'filter_cfgg': did you mean 'filter_cfg'?"
    ]


def test_a_key_without_a_close_name_lists_what_is_taken():
    (line,) = problems(scope='mmengine', train_cfg=dict(type='IterBasedTrainLoop', zzz=1))
    assert line == (
        "train_cfg.zzz: IterBasedTrainLoop takes no argument 'zzz': it takes dynamic_intervals, "
        'max_iters, type, val_begin, val_interval'
    )


def test_what_a_runner_part_does_with_its_keys_is_left_alone():
    assert not problems(
        # Runner's own keys: a hook's priority, a scheduler's conversion, the wrapper's parts
        default_hooks=dict(timer=None, checkpoint=dict(type='CheckpointHook', priority=90)),
        param_scheduler=dict(type='LinearLR', convert_to_iter_based=True),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg={}, clip_grad=None),
        train_dataloader=dict(LOADER, num_batch_per_epoch=2, persistent_workers=False),
        # **kwargs kept for later (EMAHook's for its model) or not handed on: anything goes
        custom_hooks=[dict(type='EMAHook', momentum=0.1, anything=1)],
        val_evaluator=dict(type='mmseg.IoUMetric', anything=1),
        # a type that does not resolve (its own error names it), or another constructor
        test_evaluator=dict(type='NoSuchMetric', anything=1),
        val_cfg=dict(type='NoSuchLoop', anything=1),
    )
    assert not problems(optim_wrapper=dict(constructor='NoSuch', optimizer=dict(type='SGD', x=1)))


def test_kwargs_are_followed_along_the_mro_only_as_far_as_they_are_handed_on():
    from mmdet.datasets import CocoDataset
    from mmengine.hooks import EMAHook

    assert {'data_root', 'seg_map_suffix', 'lazy_init'} <= accepted_keys(CocoDataset)
    assert accepted_keys(EMAHook) is None

    class Own(CocoDataset):
        def __init__(self, own=1, **kwargs):
            kwargs = {'test_mode': True, **kwargs}
            kwargs.pop('popped', None)
            super().__init__(**kwargs)

    class Kept(Own):
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            super().__init__()

    assert {'own', 'popped', 'data_root'} <= accepted_keys(Own)
    assert 'data_rot' not in accepted_keys(Own)
    assert accepted_keys(Kept) is None


def test_check_keys_raises_one_line_per_key():
    cfg = Config(dict(default_scope='mmdet', train_cfg=dict(by_epoch=True, max_epoch=1, vi=1)))
    with pytest.raises(ConfigError) as raised:
        check_keys(cfg)
    assert len(str(raised.value).splitlines()) == 2


def test_load_config_checks_the_keys_of_the_options():
    with pytest.raises(ConfigError, match="did you mean 'max_epochs'"):
        load_config(DEMO, {'train_cfg.max_epoch': 1})


FOLDERS = sorted(
    osp.basename(p)
    for p in glob.glob(osp.join(ROOT, 'configs', '*'))
    if osp.isdir(p) and osp.basename(p) not in ('_base_', 'deploy')
)


@pytest.mark.parametrize('folder', FOLDERS)
def test_every_config_passes(folder):
    paths = sorted(glob.glob(osp.join(ROOT, 'configs', folder, '**', '*.py'), recursive=True))
    assert paths
    for path in paths:
        assert key_problems(Config.fromfile(path)) == [], path
