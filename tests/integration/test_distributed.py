"""Real 2-process training and testing on the CPU (gloo), through tools/dist_*.sh."""

import json
import os
import os.path as osp
import re
import sys

import pytest
import torch

from mmrepa.datasets import make_shapes_coco
from tests.helpers import DEMO, ROOT, free_port, run_script_here
from tests.helpers import run as run_command

# module-scoped fixtures: keep this file's tests on one xdist worker


def run(*cmd, **env_vars):
    env = dict(
        os.environ, PYTHON=sys.executable, PORT=str(free_port()), OMP_NUM_THREADS='1', **env_vars
    )
    return run_command('bash', *cmd, env=env)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('dist')
    data = make_shapes_coco(str(root / 'data'), num_train=8, num_val=4, size=64) + '/'
    config = root / 'dist_demo.py'
    config.write_text(f"""
_base_ = '{DEMO}'
custom_imports = dict(imports=['mmrepa', 'tests.integration.dist_hooks'],
                      allow_failed_imports=False)
custom_hooks = [dict(type='BNRecalibrationHook', num_batches=2),
                dict(type='SaveRankWeightsHook')]
env_cfg = dict(dist_cfg=dict(backend='gloo'))
train_cfg = dict(max_epochs=2, val_interval=2)
model = dict(test_cfg=dict(score_thr=0.0))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root='{data}'))
val_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(data_root='{data}'))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file='{data}annotations/val.json')
test_evaluator = val_evaluator
""")
    work = str(root / 'work')
    run('tools/dist_train.sh', str(config), '2', '--work-dir', work)
    return root, str(config), work


def assert_ranks_identical(work):
    """Weights and buffers; the BatchNorm statistics each rank recalibrated on its own batches
    (BNRecalibrationHook) are averaged over the ranks."""
    r0 = torch.load(osp.join(work, 'rank0_params.pth'))
    r1 = torch.load(osp.join(work, 'rank1_params.pth'))
    assert r0.keys() == r1.keys() and len(r0) > 10
    assert any(k.endswith('running_var') for k in r0)
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
    # 2 batches on each rank
    assert {int(v) for k, v in r0.items() if k.endswith('num_batches_tracked')} == {4}


def test_two_process_training_keeps_the_ranks_identical(setup):
    assert_ranks_identical(setup[2])


def test_slurm_scripts_train_two_tasks_on_cpu_nodes(setup, tmp_path):
    """tools/slurm_train.sh through a stand-in srun/scontrol that start the tasks locally."""
    _, config, _ = setup
    work = str(tmp_path / 'slurm')
    fake = osp.join(ROOT, 'tests', 'integration', 'fake_slurm')
    port = str(free_port())
    run(
        'tools/slurm_train.sh',
        'cpu',
        'mmrepa-test',
        config,
        work,
        '--cfg-options',
        'train_cfg.max_epochs=1',
        'train_cfg.val_interval=100',
        GPUS='2',
        GPUS_PER_NODE='0',
        MASTER_PORT=port,
        PATH=fake + os.pathsep + os.environ['PATH'],
    )
    assert_ranks_identical(work)


def test_two_process_folded_test_matches_single_process(setup):
    root, config, work = setup
    ckpt = osp.join(work, 'epoch_2.pth')
    dist_out, single_out = str(root / 'dist.json'), str(root / 'single.json')
    log = run(
        'tools/dist_test.sh',
        config,
        ckpt,
        '2',
        '--work-dir',
        str(root / 'test2'),
        '--reparam',
        '--latency-batches',
        '2',
        '--dump-metrics',
        dist_out,
    )
    assert 'reparameterized the model for testing' in log
    # fold parity: the hook's check of the whole model's outputs on a test batch
    errors = [float(e) for e in re.findall(r'max relative error (\S+)', log)]
    assert errors and max(errors) < 1e-4, log[-3000:]
    # the single-process reference: tools/test.py's main() in this process (which imports
    # tests.integration.dist_hooks as the config asks), without a subprocess's imports
    run_script_here(
        'tools/test.py',
        config,
        ckpt,
        '--work-dir',
        str(root / 'test1'),
        '--reparam',
        '--dump-metrics',
        single_out,
    )
    dist, single = json.load(open(dist_out)), json.load(open(single_out))
    assert 'coco/bbox_mAP' in single
    assert dist == single  # the 2 ranks' results are gathered into one process's metric
