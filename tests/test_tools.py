"""The command-line tools, run as a user runs them (subprocesses), on generated data."""
import json
import os.path as osp
import subprocess
import sys

import pytest

from mmrepa.datasets import make_shapes_coco

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def run_tool(*args):
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def small_data(tmp_path_factory):
    root = tmp_path_factory.mktemp('tools')
    data = make_shapes_coco(str(root / 'data'), num_train=8, num_val=4, size=64) + '/'
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{loader}.dataset.data_root={data}', f'{loader}.num_workers=0',
                    f'{loader}.persistent_workers=False']
    for ev in ('val_evaluator', 'test_evaluator'):
        options.append(f'{ev}.ann_file={data}annotations/val.json')
    options.append('model.test_cfg.score_thr=0.0')  # an untrained detector still detects
    return root, options


def test_train_then_test_with_and_without_reparam(small_data):
    root, options = small_data
    work = str(root / 'work')
    run_tool('tools/train.py', DEMO, '--work-dir', work, '--cfg-options', *options,
             'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
             'train_dataloader.batch_size=4')
    ckpt = osp.join(work, 'epoch_1.pth')
    metrics = {}
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '2'])):
        out = str(root / f'{name}.json')
        log = run_tool('tools/test.py', DEMO, ckpt, '--work-dir', work, '--dump-metrics', out,
                       *flags, '--cfg-options', *options)
        with open(out) as f:
            metrics[name] = json.load(f)
    assert 'coco/bbox_mAP' in metrics['plain']
    assert metrics['folded'] == metrics['plain']
    assert 'test_step ms / image' in log and 'parameters (M)' in log  # the latency table
