"""BranchJoinScheduleHook: the λ curves of the depth joining ramp and the hook on a fake runner."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MessageHub, MMLogger

from mmrepa.backbones.depth_rep_vit import JoinedBlock
from mmrepa.engine import BranchJoinScheduleHook
from mmrepa.engine.hooks import join_lambda
from mmrepa.engine.hooks.branch_join_schedule_hook import JOIN_SCHEDULE_MODES, join_modules

MODES = JOIN_SCHEDULE_MODES


@pytest.mark.parametrize('mode', MODES)
def test_curves_start_at_0_end_at_exactly_1_and_are_monotone(mode):
    begin, end = 10, 30
    values = [join_lambda(it, begin, end, mode) for it in range(0, 50)]
    assert values[: begin + 1] == [0.0] * (begin + 1)
    assert all(v == 1.0 for v in values[end:])  # exactly 1.0, not 0.9933
    assert all(0.0 < v < 1.0 for v in values[begin + 1 : end])
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert all(type(v) is float for v in values)


def test_curve_values_in_the_middle():
    mid = 20  # t = 0.5 between 10 and 30
    assert join_lambda(mid, 10, 30, 'linear') == 0.5
    assert join_lambda(mid, 10, 30, 'cosine') == pytest.approx(0.5, abs=1e-15)
    assert join_lambda(mid, 10, 30, 'sqrt') == pytest.approx(math.sqrt(0.5), abs=1e-15)
    expected = (1 - math.exp(-2.5)) / (1 - math.exp(-5))
    assert join_lambda(mid, 10, 30, 'exp') == pytest.approx(expected, abs=1e-15)
    # cosine is an S-curve: slower than linear at the start, faster at the end
    assert join_lambda(11, 10, 30, 'cosine') < join_lambda(11, 10, 30, 'linear')
    assert join_lambda(29, 10, 30, 'cosine') > join_lambda(29, 10, 30, 'linear')
    assert join_lambda(11, 10, 30, 'sqrt') > join_lambda(11, 10, 30, 'linear')
    # exponential close to the end: below 1, never above (rounding is clamped)
    assert 0.99 < join_lambda(999_999, 0, 1_000_000, 'exp') < 1.0


class TinyJoined(nn.Module):
    def __init__(self, deploy=False):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(
            JoinedBlock(embed_dims=8, num_heads=2, num_branches=2, deploy=deploy) for _ in range(2)
        )


class Wrapped(nn.Module):  # stands in for DistributedDataParallel (.module)
    def __init__(self, module):
        super().__init__()
        self.module = module


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def warnings(self):
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING]


_COUNT = [0]


def fake_runner(model, max_iters=100, it=0):
    _COUNT[0] += 1
    logger = MMLogger.get_instance(f'test_branch_join_{_COUNT[0]}', log_level='DEBUG')
    handler = Recorder()
    logger.addHandler(handler)
    return SimpleNamespace(
        model=model,
        iter=it,
        max_iters=max_iters,
        logger=logger,
        message_hub=MessageHub.get_instance(f'test_branch_join_{_COUNT[0]}'),
        log=handler,
    )


def lambdas(model):
    return [float(m.join_lambda) for m in model.modules() if hasattr(m, 'join_lambda')]


def host_lambdas(model):
    return [m.scheduled_value for m in model.modules() if hasattr(m, 'join_lambda')]


def run_iter(hook, runner, it):
    runner.iter = it
    hook.before_train_iter(runner, batch_idx=it)


def test_hook_sets_lambda_from_runner_iter_only():
    model = TinyJoined()
    runner = fake_runner(model, max_iters=40)
    hook = BranchJoinScheduleHook(begin_iter=10, end_iter=30, mode='cosine')
    hook.before_train(runner)
    assert lambdas(model) == [0.0] * 4  # 2 blocks × (attention, FFN)
    for it in range(40):
        for _ in range(3):  # repeated calls (gradient accumulation, retries) do not move λ
            run_iter(hook, runner, it)
            expected = join_lambda(it, 10, 30, 'cosine')
            # the float32 buffer (checkpoint) and the exact host copy used by training
            assert lambdas(model) == [float(torch.tensor(expected, dtype=torch.float32))] * 4
            assert host_lambdas(model) == [expected] * 4
            assert runner.message_hub.get_scalar('train/join_lambda').current() == expected
    assert lambdas(model) == [1.0] * 4
    hook.after_train(runner)
    assert runner.log.warnings() == []


def test_hook_unwraps_ddp_and_sets_each_block_once(monkeypatch):
    model = TinyJoined()
    calls = []
    for cls in (JoinedBlock, type(model.blocks[0].attn), type(model.blocks[0].mlp)):
        original = cls.set_join_lambda

        def recording(self, value, _original=original, _cls=cls):
            calls.append(_cls.__name__)
            _original(self, value)

        monkeypatch.setattr(cls, 'set_join_lambda', recording)
    assert [name for name, _ in join_modules(model)] == ['blocks.0', 'blocks.1']
    runner = fake_runner(Wrapped(model), max_iters=20)
    hook = BranchJoinScheduleHook(end_iter=10)
    hook.before_train(runner)
    calls.clear()
    run_iter(hook, runner, 5)
    assert calls.count('JoinedBlock') == 2
    assert calls.count('JoinedAttention') == 2 and calls.count('JoinedFFN') == 2  # via blocks
    assert lambdas(model) == [0.5] * 4


def test_hook_unwraps_a_registered_model_wrapper_for_layer_names():
    """mmengine's ``is_model_wrapper`` decides (DataParallel stands in for DDP on the CPU):
    the end-of-training warning names the layer as in the bare model."""
    model = TinyJoined()
    runner = fake_runner(nn.DataParallel(model), max_iters=20)
    hook = BranchJoinScheduleHook(end_iter=10)
    hook.before_train(runner)
    run_iter(hook, runner, 5)
    hook.after_train(runner)
    (warning,) = runner.log.warnings()
    assert ' blocks.0 ' in warning and 'module.' not in warning


def test_ratios_of_max_iters():
    model = TinyJoined()
    runner = fake_runner(model, max_iters=100)
    hook = BranchJoinScheduleHook(begin_ratio=0.2, end_ratio=0.6, mode='linear')
    hook.before_train(runner)
    run_iter(hook, runner, 40)
    assert lambdas(model) == [0.5] * 4
    run_iter(hook, runner, 60)
    assert lambdas(model) == [1.0] * 4


@pytest.mark.parametrize('mode', MODES)
def test_resume_continues_exactly(mode):
    def uninterrupted(k):
        model = TinyJoined()
        runner = fake_runner(model, max_iters=30)
        hook = BranchJoinScheduleHook(begin_iter=3, end_iter=20, mode=mode)
        hook.before_train(runner)
        for it in range(k + 1):
            run_iter(hook, runner, it)
        return model

    for k in (0, 2, 7, 19, 25):
        reference = uninterrupted(k)
        # a fresh model resumed at iteration k: before_train alone restores λ of iteration k
        model = TinyJoined()
        runner = fake_runner(model, max_iters=30, it=k)
        BranchJoinScheduleHook(begin_iter=3, end_iter=20, mode=mode).before_train(runner)
        assert lambdas(model) == lambdas(reference)
        assert host_lambdas(model) == host_lambdas(reference)
        # and the checkpointed buffer carries the same λ
        restored = TinyJoined()
        restored.load_state_dict(reference.state_dict())
        assert lambdas(restored) == lambdas(reference)
        assert [b.current_join_lambda for b in restored.blocks] == lambdas(reference)[::2]


def test_warns_when_the_ramp_ends_after_max_iters_and_at_the_end_of_training():
    model = TinyJoined()
    runner = fake_runner(model, max_iters=10)
    hook = BranchJoinScheduleHook(begin_iter=2, end_iter=20, mode='sqrt')
    hook.before_train(runner)
    (warning,) = runner.log.warnings()
    assert 'end_iter=20' in warning and 'max_iters=10' in warning
    for it in range(10):
        run_iter(hook, runner, it)
    runner.iter = 10
    hook.after_train(runner)
    warning = runner.log.warnings()[-1]
    lam = join_lambda(9, 2, 20, 'sqrt')
    assert 'blocks.0' in warning and f'{lam:g}' in warning and 'cannot be folded' in warning


def test_warns_at_the_end_if_a_layer_was_set_below_1_behind_the_hook():
    model = TinyJoined()
    runner = fake_runner(model, max_iters=10)
    hook = BranchJoinScheduleHook(end_ratio=0.5)
    hook.before_train(runner)
    assert runner.log.warnings() == []
    run_iter(hook, runner, 9)
    model.blocks[1].mlp.set_join_lambda(0.25)
    hook.after_train(runner)
    (warning,) = runner.log.warnings()
    assert 'blocks.1.mlp' in warning and '0.25' in warning


@pytest.mark.parametrize(
    'kwargs, option',
    [
        (dict(end_iter=10, mode='quadratic'), 'mode'),
        (dict(begin_iter=10, end_iter=10), 'end_iter'),
        (dict(begin_iter=12, end_iter=10), 'end_iter'),
        (dict(end_iter=0), 'end_iter'),
        (dict(end_iter=-5), 'end_iter'),
        (dict(begin_iter=-1, end_iter=5), 'begin_iter'),
        (dict(end_ratio=-0.1), 'end_ratio'),
        (dict(end_ratio=1.5), 'end_ratio'),
        (dict(begin_ratio=0.5, end_ratio=0.5), 'end_ratio'),
        (dict(begin_ratio=-0.5, end_ratio=0.5), 'begin_ratio'),
        (dict(), 'end_iter'),
        (dict(end_iter=10, end_ratio=0.5), 'end_ratio'),
        (dict(begin_iter=1, begin_ratio=0.1, end_iter=10), 'begin_ratio'),
        (dict(end_iter=2.5), 'end_iter'),
    ],
)
def test_refuses_bad_options_naming_them(kwargs, option):
    with pytest.raises(ValueError, match=option):
        BranchJoinScheduleHook(**kwargs)


def test_refuses_an_empty_ramp_in_mixed_units_and_a_model_without_joined_modules():
    runner = fake_runner(TinyJoined(), max_iters=100)
    with pytest.raises(ValueError, match='begin_ratio=0.5, end_iter=50'):
        BranchJoinScheduleHook(begin_ratio=0.5, end_iter=50).before_train(runner)
    runner = fake_runner(nn.Sequential(nn.Linear(4, 4)), max_iters=100)
    with pytest.raises(ValueError, match='no joined module'):
        BranchJoinScheduleHook(end_iter=10).before_train(runner)


def test_folded_model_refuses_lambda_below_1_but_accepts_the_end_of_the_ramp():
    model = TinyJoined(deploy=True)
    runner = fake_runner(model, max_iters=10, it=0)
    with pytest.raises(ValueError, match='deploy'):
        BranchJoinScheduleHook(end_iter=5).before_train(runner)
    runner.iter = 5
    hook = BranchJoinScheduleHook(end_iter=5)
    hook.before_train(runner)
    hook.after_train(runner)
    assert runner.log.warnings() == []


def test_forward_uses_the_scheduled_lambda():
    torch.manual_seed(0)
    model = TinyJoined()
    block = model.blocks[0].train()
    x = torch.randn(1, 5, 8)
    runner = fake_runner(model, max_iters=10)
    hook = BranchJoinScheduleHook(end_iter=4)
    hook.before_train(runner)
    out0 = block(x)
    run_iter(hook, runner, 4)
    out1 = block(x)
    block.set_join_lambda(0.0)
    assert torch.equal(block(x), out0) and not torch.allclose(out0, out1)


class JoinedClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = JoinedBlock(embed_dims=8, num_heads=2, num_branches=2)
        self.head = nn.Linear(8, 2)


def run_runner(work_dir, max_iters, resume=False):
    from mmengine.dataset import InfiniteSampler
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    from torch.utils.data import DataLoader

    class Model(BaseModel):
        def __init__(self):
            super().__init__()
            self.net = JoinedClassifier()

        def forward(self, inputs, labels, mode='loss'):
            logits = self.net.head(self.net.block(inputs).mean(1))
            return dict(loss=nn.functional.cross_entropy(logits, labels))

    data = [dict(inputs=torch.randn(3, 8), labels=torch.tensor(i % 2)) for i in range(4)]
    lambdas_seen = []

    class Record(BranchJoinScheduleHook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            super().before_train_iter(runner, batch_idx, data_batch)
            lambdas_seen.append((runner.iter, runner.model.net.block.attn.scheduled_value))

    runner = Runner(
        model=Model(),
        work_dir=str(work_dir),
        # mmengine's iteration loop sleeps 2 s at the end of another sampler's epoch
        train_dataloader=DataLoader(data, batch_size=2, sampler=InfiniteSampler(data, False)),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=3, by_epoch=False),
            logger=dict(type='LoggerHook', interval=100),
        ),
        custom_hooks=[Record(end_iter=5, mode='exp')],
        resume=resume,
        experiment_name=f'bjs_{max_iters}_{resume}',
    )
    runner.train()
    return runner, lambdas_seen


def test_real_runner_schedule_checkpoint_and_resume(tmp_path):
    runner, seen = run_runner(tmp_path, max_iters=3)  # interrupted at iteration 3 (λ < 1)
    assert seen == [(it, join_lambda(it, 0, 5, 'exp')) for it in range(3)]
    state = torch.load(tmp_path / 'iter_3.pth', map_location='cpu', weights_only=False)
    saved = float(state['state_dict']['net.block.attn.join_lambda'])
    assert saved == float(torch.tensor(join_lambda(2, 0, 5, 'exp'), dtype=torch.float32))
    # resumed: the same λ as an uninterrupted run at every iteration, exactly 1.0 from 5 on
    runner, seen = run_runner(tmp_path, max_iters=7, resume=True)
    assert seen == [(it, join_lambda(it, 0, 5, 'exp')) for it in range(3, 7)]
    assert [lam for it, lam in seen if it >= 5] == [1.0, 1.0]
    assert float(runner.model.net.block.mlp.join_lambda) == 1.0
