"""PRepBNScheduleHook and BatchNorm recalibration, with mmengine's Runner on generated data."""

import copy
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from mmengine.hooks import EMAHook, Hook
from mmengine.runner import Runner
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa.backbones import PRepBNSwin
from mmrepa.datasets import make_shapes_coco
from mmrepa.engine import PRepBNScheduleHook, recalibrate_bn, recalibrate_model_bn
from mmrepa.layers import PRepBN
from tests.helpers import TINY_ARCH, demo_cfg, randomize_, run_script_here

# module-scoped fixtures: keep this file's tests on one xdist worker

STATS = ('running_mean', 'running_var', 'num_batches_tracked')
LAM_KEY = 'backbone.stages.0.blocks.0.norm1.lam'


class LambdaRecorder(Hook):
    """Records the λ every PRepBN had during each training iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.values = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        layers = [m for m in runner.model.modules() if isinstance(m, PRepBN)]
        values = {m.current_lambda for m in layers} | {float(m.lam) for m in layers}
        assert len(values) == 1, values
        self.values.append(values.pop())


def prepbn_cfg(data_root, work_dir, **overrides):
    """The demo detector with a PRepBN-Swin backbone: 2 epochs of 4 iterations, gradient
    checkpointing, accumulation over 2 iterations, the schedule, EMA and the recalibration
    hook."""
    cfg = demo_cfg(data_root, work_dir, **overrides)
    cfg.model.backbone = dict(
        type='PRepBNSwin',
        arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
        window_size=4,
        out_indices=(1, 2, 3),
        drop_path_rate=0.1,
        with_cp=True,
        init_cfg=None,
    )
    cfg.model.neck.in_channels = [32, 64, 128]
    cfg.train_dataloader.batch_size = 2
    # batches that repeat when the loader is iterated again: no random flips, and no
    # AspectRatioBatchSampler (its buckets carry items over from an abandoned iteration)
    cfg.train_dataloader.dataset.pipeline[3].prob = 0.0
    cfg.train_dataloader.batch_sampler = None
    cfg.train_cfg.val_interval = 100  # no validation: not what is tested here
    cfg.optim_wrapper.accumulative_counts = 2
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=2)
    # EMA's averages (momentum 0.2) are far from the trained weights after 8 iterations
    cfg.custom_hooks = [
        dict(type='PRepBNScheduleHook', warmup_iters=2, decay_ratio=0.5),
        dict(type='EMAHook', momentum=0.2),
        dict(type='BNRecalibrationHook', num_batches=3),
    ]
    return cfg


def train(cfg):
    runner = Runner.from_cfg(cfg)
    recorder = LambdaRecorder()
    runner.register_hook(recorder)
    runner.train()
    return runner, recorder.values


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp('prepbn_runner')
    data_root = make_shapes_coco(str(base / 'data'), num_train=8, num_val=2, size=64) + '/'
    cfg = prepbn_cfg(data_root, str(base / 'train'))
    runner, values = train(cfg)
    return data_root, cfg, runner, values


def test_schedule_follows_the_runner_iteration(trained):
    _, _, runner, values = trained
    schedule = next(h for h in runner.hooks if isinstance(h, PRepBNScheduleHook))
    assert runner.max_iters == 8 and schedule.decay_iters == 4  # decay_ratio=0.5 of 8
    # with_cp recomputes blocks and accumulation skips optimizer steps: neither moves λ
    assert values == [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert runner.message_hub.get_scalar('train/prepbn_lambda').current() == 0.0


def test_lambda_is_saved_and_resume_continues_the_schedule(trained, tmp_path):
    data_root, cfg, _, values = trained
    ckpt = osp.join(cfg.work_dir, 'epoch_1.pth')
    assert float(torch.load(ckpt, map_location='cpu')['state_dict'][LAM_KEY]) == 0.75
    resumed = prepbn_cfg(data_root, str(tmp_path))
    resumed.resume, resumed.load_from = True, ckpt
    runner, resumed_values = train(resumed)
    assert runner.iter == 8
    assert resumed_values == values[4:]


def bn_statistics(state):
    return {k: v for k, v in state.items() if k.endswith(STATS)}


def recalibrated(runner, state):
    """The statistics ``recalibrate_model_bn`` gives the model with ``state``'s weights, on the
    batches the hook used (the training loader repeats them: no flips, same sampler epoch)."""
    model = copy.deepcopy(runner.model)
    model.load_state_dict(state)
    recalibrate_model_bn(model, runner.train_dataloader, 3)
    return bn_statistics(model.state_dict())


def test_recalibration_hook_runs_before_the_final_checkpoint(trained):
    _, cfg, runner, _ = trained
    state = torch.load(osp.join(cfg.work_dir, 'epoch_2.pth'), map_location='cpu')['state_dict']
    counts = {int(v) for k, v in state.items() if k.endswith('num_batches_tracked')}
    assert counts == {3}  # reset, then averaged over num_batches=3 (training counted 8+)
    ema = next(h for h in runner.hooks if isinstance(h, EMAHook)).ema_model.module
    for model in (runner.model, ema):
        assert {m.momentum for m in model.modules() if isinstance(m, _BatchNorm)} == {0.1}


def test_recalibration_reaches_the_deployed_ema_weights(trained):
    """EMAHook saves its averages as the checkpoint's state_dict: that model, with its own
    weights, is the one recalibrated."""
    _, cfg, runner, _ = trained
    ckpt = torch.load(osp.join(cfg.work_dir, 'epoch_2.pth'), map_location='cpu')
    deployed = ckpt['state_dict']
    trained_weights = {
        k[len('module.') :]: v for k, v in ckpt['ema_state_dict'].items() if k.startswith('module.')
    }
    assert not torch.equal(
        deployed['neck.fpn_convs.0.conv.weight'], trained_weights['neck.fpn_convs.0.conv.weight']
    )  # EMA is on
    expected = recalibrated(runner, deployed)
    assert expected.keys() == bn_statistics(deployed).keys() and expected
    # the same recalibration of the same weights on the same batches in one process: same bits
    for k, v in expected.items():
        assert torch.equal(deployed[k], v), k
    # statistics of the trained (not averaged) weights differ: the check above can tell
    other = recalibrated(runner, trained_weights)
    assert (
        max(
            (other[k].double() - v.double()).abs().max().item()
            for k, v in expected.items()
            if 'running_' in k
        )
        > 1e-3
    )
    # validation and testing in this process swap in the EMA parameters only (buffers stay):
    # the training model carries the same statistics
    for k, v in bn_statistics(runner.model.state_dict()).items():
        assert torch.equal(v, deployed[k]), k


def test_recalibration_tool(trained, tmp_path):
    _, cfg, _, _ = trained
    config = str(tmp_path / 'config.py')
    cfg.dump(config)
    ckpt, out = osp.join(cfg.work_dir, 'epoch_2.pth'), str(tmp_path / 'recalibrated.pth')
    # its main() in this process (asserts it succeeded); at the command line (a refusal):
    # test_tool_inputs.py::test_test_and_recalibrate_name_their_data_and_checkpoint
    run_script_here(
        'tools/recalibrate_bn.py',
        config,
        ckpt,
        out,
        '--num-batches',
        '2',
        '--work-dir',
        str(tmp_path / 'work'),
    )
    before = torch.load(ckpt, map_location='cpu')
    after = torch.load(out, map_location='cpu')
    assert after['meta'] == before['meta']
    changed = {
        k for k, v in after['state_dict'].items() if not torch.equal(v, before['state_dict'][k])
    }
    assert changed and all(k.endswith(STATS) for k in changed)
    assert {
        int(v) for k, v in after['state_dict'].items() if k.endswith('num_batches_tracked')
    } == {2}


def test_recalibration_changes_running_statistics_and_nothing_else():
    model = randomize_(PRepBNSwin(arch=TINY_ARCH, drop_path_rate=0.3, norm_eval=True)).train()
    before = copy.deepcopy(model.state_dict())
    modes = {n: m.training for n, m in model.named_modules()}
    batches = [torch.randn(2, 3, 40, 56) for _ in range(3)]
    assert recalibrate_bn(model, batches, model, num_batches=5) == 3
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    bns = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    assert changed == {f'{n}.{s}' for n in bns for s in STATS}
    assert modes == {n: m.training for n, m in model.named_modules()}
    assert {m.momentum for m in model.modules() if isinstance(m, _BatchNorm)} == {0.1}
    # drop-path is off while recalibrating: without it the statistics are the same
    no_drop = copy.deepcopy(model)
    for m in list(no_drop.modules()):
        for child_name, child in list(m.named_children()):
            if type(child).__name__ == 'DropPath':
                setattr(m, child_name, nn.Identity())
    recalibrate_bn(no_drop, batches, no_drop, num_batches=3)
    for k, v in no_drop.state_dict().items():
        assert torch.equal(v, after[k]), k
    # the first BatchNorm sees the patch embedding: its statistics are the batch average
    embed = model.patch_embed
    tokens = [embed.projection(x).flatten(2).transpose(1, 2).reshape(-1, 16) for x in batches]
    bn = embed.norm.repbn.bn
    t64 = [t.double() for t in tokens]
    # float32 against the float64 reference: a sum of n terms errs by at most gamma_n times the
    # sum of their magnitudes (gamma_n = n u / (1 - n u), u = 2^-24), the mean and variance of a
    # batch (one or two passes, sum x^2 bounding sum (x - mean)^2) and the cumulative average
    # over k batches add a few roundings each: (gamma_{n+3} + 3 k u) of the mean magnitude
    n, k, u = len(tokens[0]), len(tokens), 2.0**-24
    factor = (n + 3) * u / (1 - (n + 3) * u) + 3 * k * u
    mean_abs = torch.stack([t.abs().mean(0) for t in t64]).max(0).values
    mean_sq = torch.stack([t.square().sum(0) / (n - 1) for t in t64]).max(0).values
    mean = torch.stack([t.mean(0) for t in t64]).mean(0)
    var = torch.stack([t.var(0) for t in t64]).mean(0)
    assert ((bn.running_mean.double() - mean).abs() <= factor * mean_abs).all()
    assert ((bn.running_var.double() - var).abs() <= factor * mean_sq).all()


def test_recalibration_without_data_or_batchnorm_says_what_is_wrong():
    model = PRepBNSwin(arch=TINY_ARCH)
    with pytest.raises(ValueError, match='the data loader is empty'):
        recalibrate_bn(model, [], model, num_batches=2)
    with pytest.raises(ValueError, match='has no BatchNorm'):
        recalibrate_bn(nn.Linear(2, 2), [torch.zeros(2)], lambda x: x, num_batches=1)


def test_schedule_hook_without_prepbn_says_what_to_do():
    runner = SimpleNamespace(model=nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match='has no PRepBN layer'):
        PRepBNScheduleHook(decay_iters=10).before_train(runner)
