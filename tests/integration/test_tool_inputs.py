"""The tools name every missing data set and checkpoint before building anything."""

import os
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import BaseDataset

from mmrepa.config.inputs import (
    README_SECTION,
    MissingInput,
    find_missing_inputs,
)
from mmrepa.errors import CheckpointError, InputError
from mmrepa.integrations.cli.inputs import check_inputs
from tests.helpers import ROOT, assert_no_warnings, run_script_here, tool_process

RETINANET = osp.join(ROOT, 'configs', 'repa_swin', 'retinanet_repa_swin_b_1x_coco.py')
UPERNET = osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')
PARTS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def run_tool(cwd, tool, *args):
    """Run a tool from ``cwd`` (where no data/ or checkpoints/ exist) as a user does; (return
    code, output). A tool that reads a config starts without a warning: the refusal is the
    first thing on standard error."""
    proc = tool_process(osp.join(ROOT, 'tools', tool), *args, cwd=cwd)
    assert_no_warnings(proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr


def run_here(cwd, tool, *args):
    """``run_tool``'s run of the tool's ``main()`` in this process; (1, output) if it stopped."""
    _, log = run_script_here(osp.join('tools', tool), *args, ok=False, cwd=str(cwd))
    return 1, log


def assert_refused_before_building(code, log, cwd):
    assert code != 0, log[-3000:]
    assert 'Traceback' not in log, log[-3000:]
    assert 'nothing was built' in log
    assert os.listdir(cwd) == []  # no work dir, no log, no dumped config: no Runner was built


def test_readme_has_the_section_the_messages_point_to():
    heading = re.search(r'"(.+)"', README_SECTION).group(1)
    with open(osp.join(ROOT, 'README.md')) as f:
        assert f'## {heading}\n' in f.read()


def test_train_without_coco_and_weights_names_them_and_builds_nothing(tmp_path):
    code, log = run_tool(
        str(tmp_path), 'train.py', RETINANET, '--cfg-options', 'load_from=work_dirs/detector.pth'
    )
    assert_refused_before_building(code, log, tmp_path)
    for line in (
        'missing train annotation file: data/coco/annotations/instances_train2017.json '
        '(train_dataloader.dataset.ann_file',
        'missing train image directory: data/coco/train2017/',
        'missing val annotation file: data/coco/annotations/instances_val2017.json',
        'missing backbone pretrained checkpoint: checkpoints/repa_swin_base_in1k.pth '
        '(model.backbone.init_cfg.checkpoint',
        'missing checkpoint to start from: work_dirs/detector.pth (load_from',
    ):
        assert f'\n{line}' in log, log[-3000:]
    assert log.count(README_SECTION) == log.count('\nmissing ')
    # --resume without a checkpoint resumes from the work dir: load_from is not checked (the
    # same main() in this process: the process's exit and output are checked above)
    code, log = run_here(
        tmp_path,
        'train.py',
        RETINANET,
        '--resume',
        '--cfg-options',
        'load_from=work_dirs/detector.pth',
    )
    assert_refused_before_building(code, log, tmp_path)
    assert 'load_from' not in log and 'pretrained checkpoint' in log


def test_test_and_recalibrate_name_their_data_and_checkpoint(tmp_path):
    code, log = run_tool(str(tmp_path), 'test.py', UPERNET, 'epoch_1.pth')
    assert_refused_before_building(code, log, tmp_path)
    root = 'data/ade/ADEChallengeData2016'
    for line in (
        f'missing test image directory: {root}/images/validation '
        '(test_dataloader.dataset.data_prefix.img_path',
        f'missing test segmentation map directory: {root}/annotations/validation',
        'missing checkpoint to test: epoch_1.pth (CHECKPOINT argument',
    ):
        assert f'\n{line}' in log, log[-3000:]
    assert 'training' not in log and 'pretrained' not in log  # testing reads neither

    # in this process: the command line of the refusal is test.py's above
    code, log = run_here(tmp_path, 'recalibrate_bn.py', UPERNET, 'epoch_1.pth', 'out.pth')
    assert_refused_before_building(code, log, tmp_path)
    assert f'\nmissing train image directory: {root}/images/training' in log
    assert '\nmissing checkpoint to recalibrate: epoch_1.pth' in log
    assert 'validation' not in log


def coco_config(tmp_path):
    """The RetinaNet config pointed at a COCO layout of empty files and a tiny checkpoint."""
    cfg = Config.fromfile(RETINANET)
    data = tmp_path / 'coco'
    (data / 'annotations').mkdir(parents=True)
    for split in ('train2017', 'val2017'):
        (data / split).mkdir()
        (data / 'annotations' / f'instances_{split}.json').write_text('{}')
    weights = str(tmp_path / 'weights.pth')
    torch.save({'state_dict': {}}, weights)
    for part in PARTS:
        cfg[part].dataset.data_root = str(data) + '/'
    for part in ('val_evaluator', 'test_evaluator'):
        cfg[part].ann_file = str(data / 'annotations' / 'instances_val2017.json')
    cfg.model.backbone.init_cfg.checkpoint = weights
    return cfg, data, weights


def test_nothing_is_missing_when_the_files_exist(tmp_path):
    cfg, _, weights = coco_config(tmp_path)
    kwargs = dict(
        splits=('train', 'val', 'test'),
        pretrained=True,
        checkpoints=[('checkpoint to test', 'CHECKPOINT argument', weights)],
    )
    assert find_missing_inputs(cfg, **kwargs) == []
    # no exit for missing files; then the model checks load the CHECKPOINT into the backbone,
    # and this stand-in (an empty state dict) is no checkpoint of it
    with pytest.raises(
        CheckpointError,
        match=r'weights\.pth \(CHECKPOINT argument\) holds no '
        'weights of this RePaSwin backbone',
    ):
        check_inputs(cfg, 'tool', **kwargs)


def test_each_missing_path_is_named_once_with_its_config_key(tmp_path):
    cfg, data, _ = coco_config(tmp_path)
    os.remove(data / 'annotations' / 'instances_val2017.json')
    cfg.model.neck.init_cfg = [
        dict(type='Pretrained', checkpoint='~/nowhere/neck.pth'),
        dict(type='Pretrained', checkpoint='open-mmlab://resnet50'),
    ]
    missing = find_missing_inputs(
        cfg,
        splits=('train', 'val', 'test'),
        pretrained=True,
        checkpoints=[('checkpoint to test', 'CHECKPOINT', None)],
    )
    val_ann = str(data / 'annotations' / 'instances_val2017.json')
    # the val and test loaders and both evaluators read the same file: named once, first use
    assert missing == [
        MissingInput('val annotation file', 'val_dataloader.dataset.ann_file', val_ann),
        MissingInput(
            'neck pretrained checkpoint', 'model.neck.init_cfg.0.checkpoint', '~/nowhere/neck.pth'
        ),
    ]
    with pytest.raises(InputError) as exc:  # the tool exits with it (one_line_errors)
        check_inputs(cfg, 'tools/x.py', splits=('val',))
    lines = str(exc.value).splitlines()
    assert lines[0].startswith(f'tools/x.py: 1 input of {RETINANET} missing')
    assert lines[1:] == [str(missing[0])]
    # a val loader the runner would not use (no val_cfg) is not checked
    cfg.val_cfg = None
    assert find_missing_inputs(cfg, splits=('val',)) == []


@pytest.mark.parametrize(
    'dataset',
    [
        dict(ann_file='ann.json', data_prefix=dict(img='images/')),
        dict(ann_file='/abs/ann.json', data_prefix=dict(img='/abs/images/', seg='seg/')),
        dict(ann_file='', data_prefix=dict(img_path='images', seg_map_path='maps')),
        dict(ann_file='sub/ann.json', data_prefix=dict(img_path='')),
    ],
)
def test_paths_are_joined_as_mmengine_datasets_join_them(tmp_path, dataset):
    root = str(tmp_path / 'root')
    expected = BaseDataset(data_root=root, lazy_init=True, serialize_data=False, **dataset)
    cfg = Config(dict(train_dataloader=dict(dataset=dict(type='X', data_root=root, **dataset))))
    got = {m.key.split('.')[-1]: m.path for m in find_missing_inputs(cfg, splits=('train',))}
    if expected.ann_file:
        assert got.pop('ann_file') == expected.ann_file
    assert got.pop('data_root') == root
    # an empty prefix is data_root itself, already checked
    assert got == {k: expected.data_prefix[k] for k, v in dataset['data_prefix'].items() if v}


def test_dataset_wrappers_are_followed():
    inner = [
        dict(type='CocoDataset', data_root=f'nowhere{i}/', ann_file='a.json') for i in range(3)
    ]
    cfg = Config(
        dict(
            train_dataloader=dict(
                dataset=dict(
                    type='ConcatDataset',
                    datasets=[
                        dict(type='RepeatDataset', times=2, dataset=inner[0]),
                        dict(type='ClassBalancedDataset', oversample_thr=0.1, dataset=inner[1]),
                        inner[2],
                    ],
                )
            )
        )
    )
    keys = [
        m.key
        for m in find_missing_inputs(cfg, splits=('train',))
        if m.what == 'train annotation file'
    ]
    assert keys == [
        'train_dataloader.dataset.datasets.0.dataset.ann_file',
        'train_dataloader.dataset.datasets.1.dataset.ann_file',
        'train_dataloader.dataset.datasets.2.ann_file',
    ]


def test_urls_and_other_storage_backends_are_not_checked():
    cfg = Config(
        dict(
            model=dict(
                backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='https://x/y.pth')),
                neck=dict(init_cfg=dict(type='Pretrained', checkpoint='torchvision://r50')),
            ),
            train_dataloader=dict(dataset=dict(data_root='s3://bucket/coco/', ann_file='a.json')),
            val_cfg=dict(type='ValLoop'),
            val_evaluator=dict(type='CocoMetric'),
            val_dataloader=dict(
                dataset=dict(
                    data_root='data/coco/', ann_file='a.json', backend_args=dict(backend='petrel')
                )
            ),
        )
    )
    assert (
        find_missing_inputs(
            cfg,
            splits=('train', 'val'),
            pretrained=True,
            checkpoints=[('c', 'load_from', 'http://x/c.pth')],
        )
        == []
    )
