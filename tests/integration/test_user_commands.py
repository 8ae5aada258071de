"""The commands users type first, run as they are written: the founding command
(``tools/train.py configs/retinanet_repa_swin_b_1x_coco.py``, a config path from before the
configs moved into folders per algorithm), and every ``tools/train.py`` / ``tools/test.py``
command of README.md and docs/, from a folder that holds the configs alone (as a new clone).
Without COCO, ImageNet weights or the own data they name, each stops with the lines that say
what is missing and builds nothing; on generated data (``--data-root``) the founding
command trains and its checkpoint tests folded."""

import glob
import json
import os
import os.path as osp
import re
import shlex

import pytest

from mmrepa.config.paths import find_config
from mmrepa.datasets import make_shapes_coco
from tests.helpers import ROOT, run_script_here

FOUNDING = ('tools/train.py', 'configs/retinanet_repa_swin_b_1x_coco.py')
PAGES = [
    osp.join(ROOT, 'README.md'),
    *sorted(glob.glob(osp.join(ROOT, 'docs', '**', '*.md'), recursive=True)),
    *sorted(glob.glob(osp.join(ROOT, 'configs', '*', 'README.md'))),
]
COMMAND = re.compile(r'^\.venv/bin/python (tools/(?:train|test)\.py) (.*)$')


def documented_commands():
    """(page, script, arguments) of every runner-tool command in a page's code blocks whose
    arguments are all concrete (no CONFIG-style placeholder)."""
    found = []
    for page in PAGES:
        with open(page, encoding='utf-8') as f:
            text = f.read().replace('\\\n', ' ')
        for line in text.splitlines():
            match = COMMAND.match(line.strip())
            if match and not re.search(r'\b[A-Z]{3,}\b', match.group(2)):
                args = shlex.split(match.group(2), comments=True)
                found.append((osp.relpath(page, ROOT), match.group(1), args))
    return found


def test_the_pages_show_the_commands_this_file_runs():
    scripts = {(page, script) for page, script, _ in documented_commands()}
    assert {('README.md', 'tools/train.py'), ('README.md', 'tools/test.py')} <= scripts
    assert ('docs/training.md', 'tools/train.py') in scripts


@pytest.fixture
def checkout(tmp_path):
    """A folder with the repository's configs and nothing else (no data/, checkpoints/ or
    work_dirs/ a developer's checkout may have): the commands' relative paths, as on a new
    clone."""
    os.symlink(osp.join(ROOT, 'configs'), tmp_path / 'configs')
    return str(tmp_path)


def refused_before_building(cwd, script, *args):
    """The tool's output: exit 1, no traceback, and no work dir (nothing was built)."""
    _, log = run_script_here(script, *args, ok=False, cwd=cwd)
    assert 'Traceback' not in log, log[-3000:]
    assert os.listdir(cwd) == ['configs'], log[-3000:]
    return log


def test_the_founding_command_names_what_is_missing(checkout):
    log = refused_before_building(checkout, *FOUNDING)
    assert log.startswith(
        'tools/train.py: 6 inputs of configs/repa_swin/retinanet_repa_swin_b_1x_coco.py missing, '
        'nothing was built'
    ), log
    assert 'missing train annotation file: data/coco/annotations/instances_train2017.json' in log
    assert 'missing backbone pretrained checkpoint: checkpoints/repa_swin_base_in1k.pth' in log


@pytest.mark.parametrize(
    'page, script, args', documented_commands(), ids=lambda v: v if isinstance(v, str) else None
)
def test_each_documented_command_runs_as_written(checkout, page, script, args):
    log = refused_before_building(checkout, script, *args)
    problems = [line for line in log.splitlines() if not line.startswith('missing ')]
    assert len(problems) == 1 and problems[0].startswith(f'{script}: '), log


def test_every_config_path_in_the_pages_is_a_config():
    paths = set()
    for page in PAGES:
        with open(page, encoding='utf-8') as f:
            paths |= set(re.findall(r'\bconfigs/[\w./-]+\.py\b', f.read()))
    for path in sorted(paths):
        assert osp.isfile(osp.join(ROOT, find_config(osp.join(ROOT, path)))), path


def test_a_config_path_that_does_not_exist_names_the_closest(checkout):
    config = 'configs/retinanet_repa_swin_b_1x_cocoo.py'
    log = refused_before_building(checkout, 'tools/train.py', config)
    assert log.strip() == (
        'tools/train.py: configs/retinanet_repa_swin_b_1x_cocoo.py: no such config file: '
        'did you mean configs/repa_swin/retinanet_repa_swin_b_1x_coco.py?'
    )
    config = 'configs/repa_swin/upernet_repa_swin.py'
    log = refused_before_building(checkout, 'tools/get_flops.py', config)
    assert log.strip().startswith('tools/get_flops.py: configs/repa_swin/upernet_repa_swin.py: ')
    assert 'did you mean configs/repa_swin/upernet_repa_swin_' in log


# the founding command on a CPU: Swin-B's RetinaNet from scratch on 96-pixel images
CPU_SIZED = [
    'model.backbone.init_cfg=None',
    'model.test_cfg.score_thr=0.0',
    'default_hooks.checkpoint.save_optimizer=False',
    'train_dataloader.dataset.pipeline.2.scale=(96,96)',
    *(f'{split}_dataloader.dataset.pipeline.1.scale=(96,96)' for split in ('val', 'test')),
    *(
        f'{split}_dataloader.{key}'
        for split in ('train', 'val', 'test')
        for key in ('num_workers=0', 'persistent_workers=False')
    ),
]


def test_the_founding_command_trains_and_tests_on_own_data(tmp_path):
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=2, num_val=1, size=64)
    work = str(tmp_path / 'work')
    options = ['--data-root', data, '--work-dir', work, '--cfg-options', *CPU_SIZED]
    _, log = run_script_here(*FOUNDING, *options, 'train_cfg.max_epochs=1')
    assert f'--data-root {data}: 3 classes (circle, square, triangle)' in log
    assert 'training: 1 epochs of 1 iterations' in log
    checkpoint = osp.join(work, 'epoch_1.pth')
    assert osp.isfile(checkpoint)
    metrics = str(tmp_path / 'metrics.json')
    test = ('tools/test.py', FOUNDING[1], checkpoint, '--reparam', '--dump-metrics', metrics)
    _, log = run_script_here(*test, *options)
    assert 'ReparameterizeHook: folded model verified on a test batch' in log
    with open(metrics) as f:
        assert 'coco/bbox_mAP' in json.load(f)


@pytest.mark.parametrize(
    'script, args, expected',
    [
        ('tools/image_demo.py', ['x.pth', 'x.png', '--out-file', 'y.png'], 'checkpoint not found'),
        ('tools/deploy.py', ['x.pth', 'configs/deploy/x.py', '--out', 'y'], 'no such file: x.pth'),
        ('tools/quantize.py', ['x.pth'], 'retinanet_repa_swin_t_1x_coco.py missing'),
    ],
)
def test_the_other_tools_find_a_config_under_its_old_path(checkout, script, args, expected):
    """The old path resolves: what stops these tools is the next input, not the config."""
    log = refused_before_building(
        checkout, script, 'configs/retinanet_repa_swin_t_1x_coco.py', *args
    )
    assert expected in log and 'config not found' not in log, log
