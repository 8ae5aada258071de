"""``make demo``'s short form, as a user runs it: so that CI notices when a demo stops learning.

``tools/demo.py --smoke`` trains the classification task on a small generated set for a few
epochs, tests it as trained and folded, and must clear a top-1 bar far above chance (33 %).
"""

import argparse
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, assert_no_warnings, run_script_here, script_module


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp('demo')
    proc = subprocess.run(
        [sys.executable, 'tools/demo.py', '--smoke', '--work-dir', str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    return work, proc


def test_demo_smoke_learns_and_folds(smoke):
    work, proc = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the tools' output goes to the logs: the user reads progress lines and the summary
    assert len(proc.stdout.splitlines()) < 20, proc.stdout
    assert_no_warnings(proc.stderr)  # the demo loads configs itself: the tools' seams first
    assert '[1/1] classification: RePa-CAFormer' in proc.stdout
    assert 'demo summary: 1 of 1 tasks passed' in proc.stdout
    (row,) = json.loads((work / 'summary.json').read_text())['tasks']
    assert row['task'] == 'classification' and row['result'] == 'ok'
    assert row['trained'] >= 50 and abs(row['folded'] - row['trained']) <= 0.2
    for log in ('train', 'test_trained', 'test_folded'):
        assert (work / 'classification' / f'{log}.log').stat().st_size > 0


def test_a_task_below_its_bar_shows_per_class_scores(smoke):
    """The same run judged by an impossible bar: it did not learn, and the per-class recall
    of the test comes with the failure."""
    work, _ = smoke
    demo = script_module('tools/demo.py')
    task = demo.TASKS['classification']
    results = {
        name: json.loads((work / 'classification' / f'metrics_{name}.json').read_text())
        for name in ('trained', 'folded')
    }
    problems = demo.check(task, results, argparse.Namespace(min_top1=101.0))
    assert len(problems) == 1 and 'top-1' in problems[0] and 'did not learn' in problems[0]
    lines = demo.per_class(results['trained'], str(work / 'classification' / 'test_trained.log'))
    assert [line.split(':')[0] for line in lines] == [
        'recall of circle',
        'recall of square',
        'recall of triangle',
    ]
    recalls = [float(line.split(':')[1].split()[0]) for line in lines]
    # the classes have about a third of the 150 test images each, so the mean recall is close
    # to the accuracy
    assert abs(sum(recalls) / 3 - results['trained']['accuracy/top1']) < 5


def test_per_class_reads_the_tables_of_the_test_log(tmp_path):
    """mmdet (classwise) and mmseg print their per-class tables to the log: every table line
    is shown, nothing else."""
    log = tmp_path / 'test.log'
    log.write_text(
        '11/24 12:10:36 - mmengine - INFO - per class results:\n'
        '+-------+-----+\n| Class | IoU |\n+-------+-----+\n| a     | 1.0 |\n'
        '+-------+-----+\n'
        '11/24 12:10:36 - mmengine - INFO - Epoch(test) [100/100] mIoU: 50.0\n'
    )
    lines = script_module('tools/demo.py').per_class({'mIoU': 50.0}, str(log))
    assert lines == [
        '+-------+-----+',
        '| Class | IoU |',
        '+-------+-----+',
        '| a     | 1.0 |',
        '+-------+-----+',
    ]


def test_data_only_generates_the_data_sets_and_nothing_else(tmp_path):
    data, work = tmp_path / 'data', tmp_path / 'work'
    options = ('--data-only', '--data-dir', str(data), '--work-dir', str(work))
    _, log = run_script_here('tools/demo.py', *options, '--task', 'classification', '--smoke')
    assert log.strip().endswith('demo_shapes_cls_smoke: a folder per class (tasks classification)')
    assert sorted(os.listdir(data / 'demo_shapes_cls_smoke' / 'val')) == [
        'circle',
        'square',
        'triangle',
    ]
    assert not work.exists()  # nothing trained
