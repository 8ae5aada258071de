"""Progress lines while a run is silent: ProgressHook in a real mmengine Runner whose iterations
are slower than the hook's interval, and the Heartbeat under it. The intervals are scaled down
(seconds -> tenths); the assertions need only that a thread waiting 0.1 s runs within a 0.6 s
iteration."""

import logging
import threading
import time

import pytest
import torch
import torch.nn as nn
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import DataLoader

from mmrepa.engine.hooks import ProgressHook
from mmrepa.integrations.cli.runner import run
from mmrepa.utils.progress import Heartbeat, progress_interval, step

SLOW = 0.6  # seconds per iteration
INTERVAL = 0.1


class SlowModel(BaseModel):
    def __init__(self, fail_at=None):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.calls, self.fail_at = 0, fail_at

    def forward(self, inputs, mode='loss'):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError('broken batch')
        time.sleep(SLOW)
        out = self.linear(inputs)
        return dict(loss=out.square().mean()) if mode == 'loss' else list(out)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def slow_runner(tmp_path, name, fail_at=None):
    data = [dict(inputs=torch.randn(2)) for _ in range(4)]
    runner = Runner(
        model=SlowModel(fail_at),
        work_dir=str(tmp_path),
        train_dataloader=DataLoader(data, batch_size=2, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=100)),
        custom_hooks=[ProgressHook(interval=INTERVAL)],
        experiment_name=name,
    )
    lines = Lines()
    runner.logger.addHandler(lines)
    return runner, lines.lines


def progress_threads():
    return [t for t in threading.enumerate() if t.name == 'mmrepa-progress']


def test_a_run_slower_than_the_logger_interval_says_where_it_is(tmp_path):
    runner, lines = slow_runner(tmp_path, 'progress_slow')
    run(runner, 'train')
    assert 'training: 2 epochs of 2 iterations, from iteration 1' in lines, lines
    beats = [line for line in lines if 'running for' in line]
    # a line within each iteration: the first before any rate is known, later ones with the ETA
    assert any(line.startswith('Epoch(train) [1][0/2]  iteration 1 running for') for line in beats)
    with_eta = [line for line in beats if line.startswith('Epoch(train) [2][1/2]  eta: 0:00:0')]
    assert with_eta and all('s/iter  iteration 2 running for' in line for line in with_eta), beats
    assert not progress_threads()


def test_a_run_that_raises_leaves_no_thread(tmp_path):
    runner, _ = slow_runner(tmp_path, 'progress_raises', fail_at=2)
    with pytest.raises(RuntimeError, match='broken batch'):
        run(runner, 'train')
    assert not progress_threads()


def test_the_heartbeat_stays_quiet_while_others_write():
    written = []
    with Heartbeat(lambda: 'beat', written.append, interval=1.0) as beat:
        for _ in range(30):  # 1.5 s, a line announced every 0.05 s
            time.sleep(0.05)
            beat.touch()
    assert written == []
    with Heartbeat(lambda: 'beat', written.append, interval=INTERVAL):
        time.sleep(SLOW)
    assert written and set(written) == {'beat'}


def test_the_interval_is_30_s_unless_set(monkeypatch):
    monkeypatch.delenv('MMREPA_PROGRESS_INTERVAL', raising=False)
    assert progress_interval() == 30.0
    monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', '5')
    assert progress_interval() == 5.0
    for bad in ('soon', '0', '-1', 'inf', 'nan'):
        monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', bad)
        assert progress_interval() == 30.0


def test_a_tools_step_names_itself_while_it_runs(monkeypatch, capsys):
    monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', str(INTERVAL))
    with step('tools/deploy.py', 'exporting to ONNX'):
        time.sleep(SLOW)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(
        line.startswith('tools/deploy.py: exporting to ONNX (running for ') for line in lines
    ), lines
    assert not progress_threads()


class SlowStart(Hook):
    def before_test(self, runner):  # as ReparameterizeHook folds, verifies and times
        time.sleep(SLOW)


class SlowMetric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.append(0.0)

    def compute_metrics(self, results):
        time.sleep(SLOW)
        return dict(score=0.0)


def test_a_test_run_says_when_it_prepares_and_evaluates(tmp_path):
    data = [dict(inputs=torch.randn(2)) for _ in range(4)]
    runner = Runner(
        model=SlowModel(),
        work_dir=str(tmp_path),
        test_dataloader=DataLoader(data, batch_size=2, shuffle=False),
        test_cfg=dict(),
        test_evaluator=SlowMetric(),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=100)),
        custom_hooks=[ProgressHook(interval=INTERVAL), SlowStart()],
        experiment_name='progress_test',
    )
    lines = Lines()
    runner.logger.addHandler(lines)
    run(runner, 'test')
    assert any(line.startswith('preparing the run for ') for line in lines.lines), lines.lines
    assert 'test: 2 iterations' in lines.lines
    assert any(line.startswith('Epoch(test) [0/2]  iteration 1 running') for line in lines.lines)
    assert any(line.startswith('Epoch(test) [2/2]  evaluating for ') for line in lines.lines)
