"""Sharded training (FlexibleRunner + FoldableFSDPStrategy) on 2 gloo processes on the CPU.

One launch (tests/integration/fsdp_worker.py) trains a tiny RePa-Swin (BatchNorm FFNs,
BNRecalibrationHook) and a tiny DepthRepViT (BranchJoinScheduleHook: λ reaches 1 at iteration
3) for 4 iterations with FSDP, tests both folded (ReparameterizeHook), trains the DepthRepViT
with DDP too, resumes the sharded RePa-Swin from its iteration-2 checkpoint and trains it in
bfloat16 mixed precision, trains a tiny RePa-Swin with LayerNorms under every sharding
strategy and in one process, and trains a tiny RepOpt-VGG with RepOptSGD and RepOptAdamW
sharded and under DDP. One process is the reference where it computes the same thing (no
BatchNorm); with BatchNorms each rank normalises with its own batch's statistics, which one
process with the whole batch would not, and 2-process DDP is the reference.
"""

import glob
import os
import os.path as osp
import shutil
import sys

import pytest
import torch
from mmengine.config import Config

from mmrepa.apis import build_model
from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.checkpoint.sharded import consolidate
from tests.helpers import (
    ROOT,
    TINY_ARCH,
    free_port,
    rounding_condition,
    run,
    run_script_here,
    tiny_classifier_config,
    write_images,
)
from tests.integration.config_checks import TINY_ARCHS

# config, tiny arch, the FSDP unit, what else the worker checks
MODELS = {
    'swin': ('repa_swin/repa_swin_t_32xb128_in1k.py', TINY_ARCH, 'RePaSwinBlock', 'resume,bf16'),
    'depth': (
        'depth_rep_vit/depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py',
        TINY_ARCHS['DepthRepViT'],
        'JoinedBlock',
        'ddp',
    ),
}
# no randomness (crops, Mixup / CutMix, drop path): a resumed run draws nothing it would have
# drawn differently; BN recalibration, the fold and its check on the test
DETERMINISTIC = """
model = dict(backbone=dict(drop_path_rate=0.0), train_cfg=dict(_delete_=True, augments=None))
_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(32, 32)),
             dict(type='PackInputs')]
train_dataloader = dict(dataset=dict(pipeline=_pipeline), sampler=dict(shuffle=False))
val_dataloader = dict(dataset=dict(pipeline=_pipeline))
test_dataloader = val_dataloader
default_hooks = dict(checkpoint=dict(interval=2))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
test_cfg = dict(type='FoldedTestLoop')
sync_bn = None  # needs CUDA
"""
HOOKS = {
    # AdamW: LAMB's per-tensor trust ratio needs whole tensors (refused under sharding)
    'swin': "optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, "
    'weight_decay=0.05))\n'
    "custom_hooks = [dict(type='BNRecalibrationHook', num_batches=2), "
    "dict(type='ReparameterizeHook', measure_latency=False)]\n"
    "model.update(backbone=dict(ffn_norm='BN', drop_path_rate=0.0))\n",
    'depth': "custom_hooks = [dict(type='BranchJoinScheduleHook', end_iter=3), "
    "dict(type='ReparameterizeHook', measure_latency=False)]\n",
}


@pytest.fixture(scope='module')
def launch(tmp_path_factory):
    root = tmp_path_factory.mktemp('fsdp')
    data = write_images(str(root / 'data'), count=8)
    args = []
    for name, (base, arch, block, checks) in MODELS.items():
        path = tiny_classifier_config(base, arch, data, str(root / f'{name}_base.py'))
        with open(root / f'{name}.py', 'w') as f:
            f.write(f'_base_ = {path!r}\n' + DETERMINISTIC + HOOKS[name])
        args.append(f'{name}={root / name}.py={block}={checks}')
    work = str(root / 'work')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    run(
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--nproc_per_node=2',
        f'--master_port={free_port()}',
        osp.join(ROOT, 'tests', 'integration', 'fsdp_worker.py'),
        work,
        *args,
        env=env,
    )
    ranks = [torch.load(osp.join(work, f'rank{r}.pth'), weights_only=False) for r in (0, 1)]
    return root, work, ranks


# float32 DDP against FSDP: 2 ranks' gradients sum exactly in either order and halving is
# exact, so the bits agree where both run one kernel; a kernel that treats a flat shard's tail
# apart from its vector body may round an elementwise AdamW operation differently, once each:
# 4 steps x at most 16 roundings of u = 2^-24, relative to the parameter or to its step
# (lr times Adam's normalised update, below the parameter's scale here)
FLOAT32_STEPS = dict(rtol=64 * 2.0**-24, atol=64 * 2.0**-24)

# float64 against float64 in another order of sums: a sum of n <= 10^3 terms errs by at most
# gamma_n ~ 1e-13 of its magnitudes (u = 2^-53), a few steps add a few of those
FLOAT64_ORDER = dict(rtol=1e-10, atol=1e-12)


def test_sharded_training_equals_ddp(launch):
    """DepthRepViT (LayerNorms, AdamW): the same per-rank batches give the same model."""
    r0, r1 = launch[2][0]['depth'], launch[2][1]['depth']
    assert r0['ddp'].keys() == r0['fsdp'].keys()
    for k, v in r0['ddp'].items():
        assert torch.allclose(v.double(), r0['fsdp'][k].double(), **FLOAT32_STEPS), k
        assert torch.equal(r0['fsdp'][k], r1['fsdp'][k]), k
    lams = [float(v) for k, v in r0['fsdp'].items() if k.endswith('join_lambda')]
    assert lams and set(lams) == {1.0}  # the schedule ran on every rank: foldable
    assert 'accuracy/top1' in r0['fsdp_metrics']  # the folded copy was tested


def test_sharded_resume_is_exact_and_bn_recalibration_averages(launch):
    """RePa-Swin (BatchNorm FFNs, BNRecalibrationHook): resumed from the sharded iteration-2
    checkpoint, iterations 3 and 4 give the same bits; the recalibrated statistics (each rank
    its own two batches) end identical on the ranks."""
    r0, r1 = launch[2][0]['swin'], launch[2][1]['swin']
    for k, v in r0['fsdp'].items():
        assert torch.equal(v, r0['resumed'][k]), k
        assert torch.equal(v, r1['fsdp'][k]), k
    counts = {int(v) for k, v in r0['fsdp'].items() if k.endswith('num_batches_tracked')}
    assert counts == {4}  # num_batches=2 on each rank, summed over the ranks


@pytest.mark.parametrize(
    'backbone, mode',
    [
        ('swin', 'FULL_SHARD'),
        ('swin', 'SHARD_GRAD_OP'),
        ('swin', 'NO_SHARD'),
        ('depth', 'FULL_SHARD'),
    ],
)
def test_sharded_training_equals_one_process(launch, backbone, mode):
    """RePa-Swin with LayerNorms and DepthRepViT (LayerNorms only) in float64: each rank's half
    of every batch under FSDP gives what one process gives on the whole batches (the mean of
    the ranks' gradients is the whole batch's); only the order of the sums differs."""
    single = launch[2][0]['reference'][backbone]['single']
    for rank in (0, 1):
        sharded = launch[2][rank]['reference'][backbone][mode]
        assert sharded.keys() == single.keys()
        for k, v in single.items():
            assert v.dtype == torch.float64 and torch.allclose(sharded[k], v, **FLOAT64_ORDER), (
                rank,
                k,
                (sharded[k] - v).abs().max(),
            )


def test_bf16_mixed_precision(launch):
    """RePa-Swin (BatchNorm FFNs) trained sharded in bfloat16 (configs/_base_/runtime/
    fsdp_bf16.py): the BatchNorm statistics stay float32 and equal on the ranks, the folded
    test reads the float32 weights, and each loss is its weights' loss up to bfloat16's
    rounding (and the float32 run's up to float32's)."""
    r0, r1 = launch[2][0]['swin'], launch[2][1]['swin']
    stats = {k: v for k, v in r0['bf16_buffers'].items() if v.is_floating_point()}
    assert any(k.endswith('running_var') for k in stats)
    assert {v.dtype for v in stats.values()} == {torch.float32}
    assert all(torch.equal(v, r1['bf16_buffers'][k]) for k, v in r0['bf16_buffers'].items())
    # the gathered copy the hook folded and tested is the optimizer's float32 pieces, joined
    full = r0['bf16']
    for k, piece in r0['bf16_pieces'].items():
        joined = torch.cat([piece.reshape(-1), r1['bf16_pieces'][k].reshape(-1)])
        assert piece.dtype == full[k].dtype == torch.float32, k
        assert torch.equal(full[k].reshape(-1), joined), k
    assert 'accuracy/top1' in r0['bf16_metrics']
    # each run's losses of iterations 1 and 3 (from the initial weights and from its iteration-2
    # checkpoint) against float64 on the same weights and batch (the runs' weights part after
    # the first step, so neither is the other's reference). Rounding to the run's precision
    # (bfloat16: u = 2^-8, float32: 2^-24) moves each rounded tensor t by at most u|t|, and the
    # loss, to first order, by sum dL/dt * that. Taken as independent and of mean zero (the
    # probabilistic model of Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019), Hoeffding's
    # inequality bounds the sum by 5 u kappa, kappa = sqrt(sum (dL/dt * t)^2), except with
    # probability 2 exp(-12.5) < 1e-5; the logged loss rounds once more (u |L|)
    root, work = launch[:2]
    starts = {1: torch.load(osp.join(work, 'swin_init.pth'), weights_only=True)['state_dict']}
    for name, u in (('bf16', 2.0**-8), ('fsdp', 2.0**-24)):
        starts[3] = consolidate(osp.join(work, f'swin_{name}', 'iter_2.pth'))['state_dict']
        for iteration, weights in starts.items():
            batch = r0[f'{name}_batches'][iteration - 1]
            reference, kappa = float64_loss(str(root / 'swin.py'), weights, batch)
            bound = 5 * u * kappa + u * abs(reference)
            error = abs(r0[f'{name}_losses'][iteration - 1] - reference)
            assert error <= bound, (name, iteration, error, bound, reference)


def float64_loss(config, weights, batch):
    """The training loss of ``weights`` on ``batch`` (BatchNorm on the batch's statistics) in
    float64, and kappa = sqrt(sum (dL/dt * t)^2) over the weights, the input and every result
    of an operation of the forward: the tensors bfloat16 mixed precision rounds."""
    model = build_model(Config.fromfile(config)).double().train()
    model.load_state_dict(weights)
    data = model.data_preprocessor(batch, True)
    return rounding_condition(
        lambda x: sum(model(x, data['data_samples'], mode='loss').values()),
        model,
        data['inputs'].double(),
    )


@pytest.mark.parametrize('optimizer', ['sgd', 'adamw'])
def test_repopt_optimizers_on_pieces_equal_ddp(launch, optimizer):
    """Each rank's RepOpt optimizer multiplies its pieces of the kernels by their slices of the
    multipliers, and the CSLA gradient norm it clips by (momentum / Adam moments, decay on the
    weights only) sums over the ranks: float64, so only the order of the sums differs."""
    (ddp, ddp_norms, ddp_decays), (fsdp, fsdp_norms, fsdp_decays) = (
        launch[2][0]['repopt'][optimizer][k] for k in ('ddp', 'fsdp')
    )
    # paramwise_cfg's flat_decay_mult went by the whole tensors' shapes, not the 1-D pieces'
    assert fsdp_decays == ddp_decays and fsdp_decays['head.weight'] > 0
    assert ddp.keys() == fsdp.keys()
    for k, v in ddp.items():
        assert torch.allclose(v, fsdp[k], **FLOAT64_ORDER), k
    assert fsdp_norms == pytest.approx(ddp_norms, rel=1e-12)
    assert min(ddp_norms) > 0.05  # every step clipped (max_norm 0.05)
    other = launch[2][1]['repopt'][optimizer]['fsdp'][0]
    assert all(torch.equal(v, other[k]) for k, v in fsdp.items() if 'running' not in k)


@pytest.mark.parametrize('strategy', ['DeepSpeedStrategy', 'FSDPStrategy'])
def test_a_strategy_that_cannot_run_here_is_one_line(launch, strategy):
    if torch.cuda.is_available():
        pytest.skip('both run with CUDA')
    _, log = run_script_here(
        'tools/train.py',
        str(launch[0] / 'swin.py'),
        '--cfg-options',
        'runner_type=FlexibleRunner',
        f'strategy.type={strategy}',
        ok=False,
    )
    assert strategy in log.strip().splitlines()[-1]


def test_split_policy_is_refused(launch):
    message = launch[2][0]['split_error']
    assert 'splits the foldable block' in message and '\n' not in message


def test_consolidated_checkpoint_tests_like_the_sharded_run(launch):
    root, work, ranks = launch
    sharded, out = osp.join(work, 'swin_fsdp', 'iter_4.pth'), str(root / 'full.pth')
    run_script_here('tools/consolidate_checkpoint.py', sharded, out)
    full = load_checkpoint_file(out)['state_dict']
    assert full.keys() == ranks[0]['swin']['fsdp'].keys()
    assert all(torch.equal(full[k], v) for k, v in ranks[0]['swin']['fsdp'].items())
    # single process, folded, from the consolidated checkpoint: the sharded run's metric
    metrics = str(root / 'metrics.json')
    run_script_here(
        'tools/test.py',
        str(root / 'swin.py'),
        out,
        '--reparam',
        '--latency-batches',
        '0',
        '--work-dir',
        str(root / 'test1'),
        '--dump-metrics',
        metrics,
    )
    import json

    assert json.load(open(metrics)) == pytest.approx(ranks[0]['swin']['fsdp_metrics'])
    # a rank file missing: one line naming it
    partial = root / 'partial.pth'
    partial.mkdir()
    shutil.copy(osp.join(sharded, 'rank0.pth'), partial / 'rank0.pth')
    _, log = run_script_here(
        'tools/consolidate_checkpoint.py', str(partial), str(root / 'p.pth'), ok=False
    )
    assert 'rank1.pth are missing' in log.strip().splitlines()[-1]


@pytest.mark.parametrize(
    'optimizer, clip, message',
    [
        ('Lamb', None, 'per-tensor trust ratio'),
        ('AdamW', dict(max_norm=1.0), 'clip_grad by norm'),
    ],
)
def test_what_needs_whole_tensors_is_refused(optimizer, clip, message):
    from mmengine.optim import OptimWrapper
    from mmpretrain.engine.optimizers import Lamb

    from mmrepa.engine.optimizers import RepOptAdamW, RepOptSGD
    from mmrepa.engine.strategies import _check_sharded_optimizer
    from mmrepa.errors import ConfigError

    params = [torch.nn.Parameter(torch.ones(2))]
    optim = Lamb(params) if optimizer == 'Lamb' else torch.optim.AdamW(params)
    with pytest.raises(ConfigError, match=message):
        _check_sharded_optimizer(OptimWrapper(optim, clip_grad=clip))
    for fine in (torch.optim.AdamW, RepOptSGD, RepOptAdamW):  # RepOpt: the strategy slices
        _check_sharded_optimizer(OptimWrapper(fine(params)))


@pytest.mark.parametrize(
    'path', sorted(glob.glob(osp.join(ROOT, 'configs', '*', '*_fsdp*.py'))), ids=osp.basename
)
def test_sharded_configs(path):
    """Each sharded config runs on FlexibleRunner with an optimizer sharding can run, and its
    FSDP unit never lies inside a foldable block of its backbone (built tiny); activation
    checkpointing on."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmrepa.engine.strategies import is_foldable_block
    from tests.integration.config_checks import build, shrink_backbone

    cfg = Config.fromfile(path)
    assert cfg.runner_type == 'FlexibleRunner' and cfg.strategy.type == 'FoldableFSDPStrategy'
    assert cfg.optim_wrapper.optimizer.type in ('AdamW', 'SGD') and not cfg.optim_wrapper.get(
        'clip_grad'
    )
    assert cfg.model.backbone.with_cp is True
    (block,) = cfg.strategy.model_wrapper.auto_wrap_policy.block_types
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        backbone = build(shrink_backbone(cfg)).backbone  # the full size's wiring checked
    assert any(type(m).__name__ == block for m in backbone.modules())
    for m in backbone.modules():  # a unit holds whole foldable blocks, never part of one
        if is_foldable_block(m) and type(m).__name__ != block:
            assert not any(type(d).__name__ == block for d in m.modules())
