"""The CUDA tier (marker ``cuda``, ``make test-cuda``): what the rest of the suite only runs on
the CPU, on the GPU. Mixed-precision training through mmengine (float16 with ``AmpOptimWrapper``
and its loss scaler, bfloat16) and a folded, verified test after it; DDP with SyncBatchNorm over
NCCL and the SyncBN kernels themselves; FSDP (``FoldableFSDPStrategy``) on one GPU; folds
computed and checked on the device, in float64 and float32; BatchNorm recalibration against
statistics computed naively; ONNX export of a model on the device, checked by onnxruntime.

Where: the ``device`` fixture (tests/conftest.py): CUDA when there is one, else the CPU when
``MMREPA_TEST_DEVICE=cpu`` (NCCL becomes gloo; what cannot run there skips and says why), else
skipped. Process groups are of this process alone (world size 1) and destroyed after each test.

Tolerances are bounds of rounding, never fitted to a run: the unit roundoff u of the dtype
(2^-53 float64, 2^-24 float32) times a size factor (the number of terms the compared values
sum through, :func:`summed_fan_in`) times the magnitude compared. The float32 comparisons run
in IEEE float32 (:func:`ieee_float32`): TF32, cuDNN's default for convolutions, keeps 10
mantissa bits, not 23. The mixed-precision runs keep torch's defaults, as a user's would.

Imports: torch, mmengine, mmrepa and the tests' helpers only (the GPU machine has mmengine,
mmcv-lite without ops and mmpretrain, not mmdet or mmseg); onnx and onnxruntime where used.
"""

import contextlib
import copy
import itertools
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from mmengine.dataset import InfiniteSampler
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.hooks import Hook
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper
from mmengine.runner import FlexibleRunner, Runner
from mmengine.runner.amp import autocast
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, PRepBNSwin, RePaSwin, RepOptVGG
from mmrepa.engine import BNRecalibrationHook, ReparameterizeHook
from tests.helpers import (
    METAFORMER_TINY,
    REPOPT_VGG_TINY,
    TINY_ARCH,
    free_port,
    randomize_,
)

pytestmark = pytest.mark.cuda

CLASSES = 3
ITERS = 3  # training iterations of every run
LR = 0.05

# ------------------------------------------------------------------------------ precision


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2  # 2^-53 float64, 2^-24 float32


def summed_fan_in(model: nn.Module) -> int:
    """The terms of the dot products a value passes through, summed over every Linear and
    convolution of ``model``: a dot product of n terms errs by at most n·u relative to the sum
    of its terms' magnitudes (Higham, Accuracy and Stability, 3.1), and the layers' errors add."""
    n = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            n += m.in_features
        elif isinstance(m, nn.modules.conv._ConvNd):
            n += m.in_channels // m.groups * math.prod(m.kernel_size)
    return n


def rounding_bound(dtype: torch.dtype, size: int, scale: float) -> float:
    # unit roundoff of the dtype (2^-53 / 2^-24) × the size factor × the magnitude compared
    return unit_roundoff(dtype) * size * scale


@contextlib.contextmanager
def ieee_float32():
    """float32 matrix products and convolutions in IEEE float32 on the GPU: cuDNN convolves in
    TF32 by default (10 mantissa bits), which no 2^-24 bound covers. Inert on the CPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def within(err: float, bound: float, what: str) -> None:
    assert err <= bound, f'{what}: differs by {err:.3e}, bound {bound:.3e}'


def assert_within(out, ref, bound_of, what):
    """Every tensor of ``out`` within ``bound_of(ref tensor)`` of ``ref``'s, elementwise."""
    out, ref = list(out), list(ref)
    assert len(out) == len(ref), what
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape and o.device == r.device, (what, i)
        within((o - r).abs().max().item(), bound_of(r), f'{what}[{i}]')


# ------------------------------------------------------------------------ a tiny classifier


class TinyClassifier(BaseModel):
    """A tiny RePa-Swin (BatchNorm in its FFNs, drop-path) and a linear head on its last
    stage. The weights are drawn from ``seed`` when it is built and ``init_weights`` keeps
    them, so that a runner's model and a reference start alike. Records the dtype of its
    logits in every training forward (what autocast computed in)."""

    def __init__(self, seed=0, dtype='float32', drop_path_rate=0.1, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.backbone = RePaSwin(
                TINY_ARCH, window_size=4, drop_path_rate=drop_path_rate, out_indices=(3,)
            )
            self.head = nn.Linear(self.backbone.num_features[3], CLASSES)
        self.to(getattr(torch, dtype))
        self.train_dtypes = []

    def init_weights(self):
        pass  # the seeded weights

    def forward(self, inputs, labels=None, mode='tensor'):
        x = self.backbone(inputs.to(self.head.weight.dtype))[-1].mean((2, 3))
        logits = self.head(x)
        if mode == 'loss':
            self.train_dtypes.append(logits.dtype)
            return dict(loss=F.cross_entropy(logits.float(), labels))
        if mode == 'predict':
            return list(logits.argmax(1))
        return logits


class Accuracy(BaseMetric):
    def process(self, data_batch, data_samples):
        for pred, label in zip(data_samples, data_batch['labels']):
            self.results.append(float(pred.item() == label.item()))

    def compute_metrics(self, results):
        return dict(accuracy=sum(results) / len(results))


def samples(count=16):
    """Batches of 4 at 64 px: the last stage's BatchNorms still see 4 · 2 · 2 values of each
    channel (with fewer, a batch variance near 0 makes them ill-conditioned: no rounding
    bound without a condition number holds)."""
    g = torch.Generator().manual_seed(1)
    return [
        dict(inputs=torch.randn(3, 64, 64, generator=g), labels=torch.tensor(i % CLASSES))
        for i in range(count)
    ]


class RecordBatches(Hook):
    """The batches the run trains on, in order."""

    def __init__(self):
        self.batches = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.batches.append(copy.deepcopy(data_batch))


def runner_args(tmp_path, name, optim_wrapper=None, hooks=(), test_cfg=None):
    """A Runner's (or FlexibleRunner's) arguments for ITERS iterations on generated batches of
    4 and a test on 8 samples, seeded; no checkpoints, no log lines between."""
    data = samples()
    return dict(
        work_dir=str(tmp_path / name),
        experiment_name=name,
        # mmengine's iteration loop sleeps 2 s at the end of another sampler's epoch
        train_dataloader=DataLoader(data, batch_size=4, sampler=InfiniteSampler(data, False)),
        optim_wrapper=optim_wrapper or dict(optimizer=dict(type='SGD', lr=LR, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        test_dataloader=DataLoader(data[:8], batch_size=4),
        test_evaluator=Evaluator(Accuracy()),
        test_cfg=test_cfg or dict(type='TestLoop'),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=100), checkpoint=None),
        custom_hooks=list(hooks),
        randomness=dict(seed=0),  # the drop-path draws
    )


def one_process_reference(batches, device, **model_args):
    """A :class:`TinyClassifier` trained on ``batches`` by hand in this process, as the runs
    train it (SGD with momentum, one step per batch)."""
    model = TinyClassifier(**model_args).to(device).train()
    optim = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for batch in batches:
        data = model.data_preprocessor(copy.deepcopy(batch), True)
        model(**data, mode='loss')['loss'].backward()
        optim.step()
        optim.zero_grad()
    return model


def assert_trained_alike(state, reference, what):
    """Weights and statistics of two float64 runs of the same steps on the same batches; only
    the order of their sums differs: ITERS forwards and backwards through the model, each
    within the summed fan-in's rounding bound, relative to the largest value."""
    size = ITERS * 2 * summed_fan_in(reference)
    ref = reference.state_dict()
    assert set(state) == set(ref), what
    for k, r in ref.items():
        if not r.is_floating_point():
            assert torch.equal(state[k].cpu(), r.cpu()), (what, k)
            continue
        o = state[k].to(r.device, r.dtype)
        bound = rounding_bound(torch.float64, size, r.abs().max().item())
        within((o - r).abs().max().item(), bound, f'{what} {k}')


@contextlib.contextmanager
def one_rank_group(device, monkeypatch):
    """A process group of this process alone: NCCL on the GPU, gloo on the CPU (NCCL is
    CUDA's). mmengine's DDP and FSDP wrappers take their GPU from LOCAL_RANK."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    if device.type == 'cuda':
        torch.cuda.set_device(0)
    backend = 'nccl' if device.type == 'cuda' else 'gloo'
    dist.init_process_group(
        backend, init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1
    )
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def on(module, device):
    return {t.device.type for t in itertools.chain(module.parameters(), module.buffers())} == {
        device.type
    }


# ---------------------------------------------------------------- 1. mixed-precision training


class CPUAutocastOptimWrapper(OptimWrapper):
    """What mmengine has not for the CPU: its AmpOptimWrapper asserts a GPU (or NPU, MLU,
    MUSA). The same autocast context around the forward, in bfloat16, without a loss scaler."""

    @contextlib.contextmanager
    def optim_context(self, model):
        with super().optim_context(model), autocast(device_type='cpu', dtype=torch.bfloat16):
            yield


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_mixed_precision_training_then_a_folded_verified_test(device, dtype, tmp_path):
    if device.type == 'cpu' and dtype == 'float16':
        pytest.skip(
            "float16 AMP is CUDA's: mmengine's AmpOptimWrapper asserts a GPU and its CPU "
            'autocast takes bfloat16 only'
        )
    if device.type == 'cuda':
        # a small first scale: steps are taken from the first iteration on (no overflow skips)
        optim = dict(
            type='AmpOptimWrapper',
            dtype=dtype,
            loss_scale=dict(init_scale=2.0**10),
            optimizer=dict(type='SGD', lr=LR, momentum=0.9),
        )
    else:
        optim = dict(type=CPUAutocastOptimWrapper, optimizer=dict(type='SGD', lr=LR, momentum=0.9))
    model = TinyClassifier()
    initial = copy.deepcopy(model.state_dict())
    fold = ReparameterizeHook(verify=True)
    runner = Runner(
        model=model,
        **runner_args(tmp_path, f'amp_{dtype}', optim, [fold], dict(type='TestLoop', fp16=True)),
    )
    runner.train()
    # every training forward ran under autocast, in the asked dtype
    assert model.train_dtypes == [getattr(torch, dtype)] * ITERS
    assert on(runner.model, device)
    for k, v in runner.model.state_dict().items():
        if v.is_floating_point():  # float32 master weights and statistics, all finite
            assert v.dtype == torch.float32 and torch.isfinite(v).all(), k
    changed = [
        k for k, v in runner.model.named_parameters() if not torch.equal(v.cpu(), initial[k])
    ]
    assert 'head.weight' in changed and len(changed) > len(initial) // 3  # the steps were taken
    if device.type == 'cuda':
        scale = runner.optim_wrapper.loss_scaler.get_scale()
        assert math.isfinite(scale) and scale > 0
    bns = [m for m in runner.model.modules() if isinstance(m, _BatchNorm)]
    assert bns and all(int(m.num_batches_tracked) == ITERS for m in bns)

    metrics = runner.test()
    assert 0.0 <= metrics['accuracy'] <= 1.0
    # the hook folded a copy, verified it on a test batch on the device (it raises beyond its
    # tolerance) and put the trained model back, on the device
    assert fold.results['folded'].get('ChannelIdleFFN') == 8
    assert fold.results['verify_rel_error'] <= fold.tolerance
    assert runner.model is model and on(model, device)
    assert hasattr(model.backbone.stages[0].blocks[0].ffn, 'fc1')  # not folded


# ---------------------------------------------------------------- 2. DDP, SyncBN, FSDP


def test_ddp_with_sync_batchnorm_trains_as_one_process_and_tests_folded(
    device, tmp_path, monkeypatch
):
    """mmengine's Runner under a launcher (world size 1), its DDP wrapper and, on the GPU,
    ``sync_bn='torch'``. Every gradient goes through the backend's all-reduce (a comm hook
    counts it), and the weights end as one process training the same batches ends. On the
    CPU: gloo, and BatchNorm (torch's SyncBatchNorm refuses CPU input in a process group)."""
    cuda = device.type == 'cuda'
    with one_rank_group(device, monkeypatch) as backend:
        record, fold = RecordBatches(), ReparameterizeHook(verify=True)
        model = TinyClassifier(dtype='float64', drop_path_rate=0.0)
        runner = Runner(
            model=model,
            launcher='pytorch',
            cfg=dict(
                sync_bn='torch' if cuda else None,
                # as mmrepa's CPU launch builds it (setup_cpu_distributed): no device ids
                model_wrapper_cfg=None if cuda else dict(device_ids=None, broadcast_buffers=False),
            ),
            **runner_args(tmp_path, 'ddp', hooks=[record, fold]),
        )
        ddp = runner.model
        assert isinstance(ddp, MMDistributedDataParallel) and dist.get_backend() == backend
        synced = [m for m in ddp.module.modules() if isinstance(m, nn.SyncBatchNorm)]
        assert len(synced) == (16 if cuda else 0)  # the FFNs' BatchNorms
        reduced = []

        def count(state, bucket):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            reduced.append(bucket.buffer().numel())
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, count)
        runner.train()
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert sum(reduced) == ITERS * trainable
        reference = one_process_reference(
            record.batches, device, dtype='float64', drop_path_rate=0.0
        )
        assert_trained_alike(ddp.module.state_dict(), reference, 'DDP')

        runner.test()
        assert fold.results['verify_rel_error'] <= fold.tolerance
        assert runner.model is ddp and ddp.module is model and on(model, device)


def test_sync_batchnorm_kernels_over_nccl_agree_with_batchnorm(device, monkeypatch):
    """What SyncBatchNorm runs with more than one rank (statistics per GPU, gathered over
    NCCL, combined; its own backward) on this process's group: with world size 1 the module
    itself would call plain BatchNorm. Forward, backward and running statistics in float64
    against ``F.batch_norm``, each a sum over the N = 4·5·7 values of a channel."""
    if device.type != 'cuda':
        pytest.skip(
            'SyncBatchNorm is CUDA-only: torch refuses CPU input inside a process group '
            '(ValueError) and batch_norm_stats has no CPU kernel'
        )
    from torch.nn.modules._functions import SyncBatchNorm as SyncBatchNormFunction

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 8, 5, 7, generator=g, dtype=torch.float64) * 3 + 1).to(device)
    weight, bias = (torch.randn(8, generator=g, dtype=torch.float64).to(device) for _ in '01')
    upstream = torch.randn(x.shape, generator=g, dtype=torch.float64).to(device)
    eps, momentum, n = 1e-5, 0.1, 4 * 5 * 7
    results = []
    with one_rank_group(device, monkeypatch):
        for synced in (True, False):
            inputs = [t.clone().requires_grad_() for t in (x, weight, bias)]
            stats = [torch.zeros_like(weight), torch.ones_like(weight)]  # running mean, var
            if synced:
                y = SyncBatchNormFunction.apply(*inputs, *stats, eps, momentum, dist.group.WORLD, 1)
            else:
                y = F.batch_norm(inputs[0], *stats, *inputs[1:], True, momentum, eps)
            y.backward(upstream)
            results.append([y, *(t.grad for t in inputs), *stats])
    # four sums of n terms (mean, variance; the backward's two), each within n·u·Σ|terms|,
    # Σ|terms| ≤ n × the largest term (|x| × |upstream| at most) or the value itself
    terms = (x.abs().max() * upstream.abs().max()).item()
    assert_within(
        results[0],
        results[1],
        lambda r: rounding_bound(torch.float64, 4 * n * n, max(r.abs().max().item(), terms)),
        'SyncBatchNorm',
    )


def test_fsdp_on_one_device_trains_as_one_process_and_folds_the_gathered_model(
    device, tmp_path, monkeypatch
):
    """FlexibleRunner with FoldableFSDPStrategy (one unit per RePa-Swin block) under NCCL:
    the sharded run's weights, gathered, end as one process's on the same batches, and the
    fold hook tests the gathered copy folded and verified, then puts the sharded model back."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with one_rank_group(device, monkeypatch):
        record, fold = RecordBatches(), ReparameterizeHook(verify=True)
        policy = dict(type='foldable_block_policy', block_types=['RePaSwinBlock'])
        runner = FlexibleRunner(
            model=dict(type=TinyClassifier, dtype='float64', drop_path_rate=0.0),
            launcher='pytorch',
            strategy=dict(type='FoldableFSDPStrategy', model_wrapper=dict(auto_wrap_policy=policy)),
            **runner_args(tmp_path, 'fsdp', hooks=[record, fold]),
        )
        runner.train()
        sharded = runner.model
        assert isinstance(sharded, FSDP)
        units = [m for m in sharded.modules() if isinstance(m, FSDP)]
        assert len(units) == 1 + 8  # the root and one per block
        gathered = runner.strategy.full_model()
        assert on(gathered, device)
        reference = one_process_reference(
            record.batches, device, dtype='float64', drop_path_rate=0.0
        )
        assert_trained_alike(gathered.state_dict(), reference, 'FSDP')

        runner.test()
        assert fold.results['verify_rel_error'] <= fold.tolerance
        assert fold.results['folded'].get('ChannelIdleFFN') == 8
        assert runner.model is sharded


# ---------------------------------------------------------------- 3. folds on the device

BACKBONES = {
    'repa_swin': lambda: RePaSwin(
        TINY_ARCH, window_size=7, idle_ratio=[0.0, 0.5, 0.75, 1.0], drop_path_rate=0.0
    ),
    'caformer': lambda: CAFormer(
        METAFORMER_TINY, idle_ratio=[0.0, 0.5, 0.75, 1.0], window_size=(None, None, 3, 2)
    ),
    'repopt_vgg': lambda: RepOptVGG(REPOPT_VGG_TINY, mode='repvgg'),
    'prepbn_swin': lambda: PRepBNSwin(
        TINY_ARCH,
        attn_types='LLSS',
        linear_window_sizes=(8, 6, 5, 3),
        idle_ratio=0.5,
        drop_path_rate=0.0,
    ),
}


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_fold_on_the_device_keeps_the_outputs(device, name):
    """``mmrepa.reparameterize`` on a model on the device (the fold computes in float64
    there), against the unfolded model, in float64 and float32, on an input size that is a
    multiple of no window."""
    torch.manual_seed(0)
    model = randomize_(BACKBONES[name]()).eval()
    size = summed_fan_in(model)
    x = torch.randn(2, 3, 45, 67, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        unfolded = copy.deepcopy(model).to(device, dtype)
        with torch.no_grad(), ieee_float32():
            ref = unfolded(x.to(device, dtype))
            folded = reparameterize(copy.deepcopy(unfolded))
            out = folded(x.to(device, dtype))
        assert folded.deploy and on(folded, device), (name, dtype)
        assert {p.dtype for p in folded.parameters()} == {dtype}
        assert sum(p.numel() for p in folded.parameters()) < sum(
            p.numel() for p in unfolded.parameters()
        )
        assert_within(
            out,
            ref,
            lambda r, dtype=dtype: rounding_bound(dtype, size, r.abs().max().item()),
            f'{name} {dtype}',
        )


# ---------------------------------------------------------------- 4. BN recalibration


def naive_batchnorm(bn, seen):
    """A forward for ``bn`` that normalises by its batch's statistics computed by hand and
    records them (mean, unbiased variance), in the input's dtype."""

    def forward(x):
        dims = [0, *range(2, x.ndim)]
        shape = [1, -1] + [1] * (x.ndim - 2)
        mean = x.mean(dims)
        centred = x - mean.view(shape)
        count = x.numel() // x.shape[1]
        squares = centred.square().sum(dims)
        seen.append((mean, squares / (count - 1), count))
        y = centred / torch.sqrt(squares / count + bn.eps).view(shape)
        return y * bn.weight.view(shape) + bn.bias.view(shape)

    return forward


def test_bn_recalibration_on_the_device_matches_naive_statistics(device, tmp_path):
    """BNRecalibrationHook at the end of a run on the device (drop-path 0.3, which the
    recalibration must switch off): each BatchNorm's statistics are the plain average over 3
    training batches of the batch mean and unbiased variance of what reaches it, here
    computed in float64 by hand on a copy of the trained model, on the batches the hook ran
    (mmengine's InfiniteSampler goes on from where training stopped: not the first ones). The
    run is in IEEE float32 (no TF32) for the bound of its float32 sums."""
    model = TinyClassifier(drop_path_rate=0.3)
    calls = []  # (training mode, input) of every backbone call: ITERS steps, then the hook's
    recording = model.backbone.register_forward_pre_hook(
        lambda m, args: calls.append((m.training, args[0].clone()))
    )
    runner = Runner(
        model=model, **runner_args(tmp_path, 'recalibrate', hooks=[BNRecalibrationHook(3)])
    )
    with ieee_float32():
        runner.train()
    recording.remove()
    assert [mode for mode, _ in calls] == [True] * ITERS + [False] * 3  # drop-path off
    recalibrated_on = [x for _, x in calls[ITERS:]]
    assert recalibrated_on[0].device.type == device.type
    bns = {n: m for n, m in model.backbone.named_modules() if isinstance(m, _BatchNorm)}
    assert len(bns) == 16 and on(model, device)  # 2 in each FFN
    assert all(int(m.num_batches_tracked) == 3 and m.momentum == 0.1 for m in bns.values())
    assert model.training and all(m.training for m in bns.values())  # modes as they were

    reference = copy.deepcopy(model).double().eval()
    seen = {n: [] for n in bns}
    for n, m in reference.backbone.named_modules():
        if n in seen:
            m.forward = naive_batchnorm(m, seen[n])
    with torch.no_grad():
        for inputs in recalibrated_on:
            reference.backbone(inputs.double())
    size = summed_fan_in(model.backbone)
    for n, bn in bns.items():
        means, variances, counts = zip(*seen[n])
        assert len(means) == 3, n
        mean, var = sum(means) / 3, sum(variances) / 3
        spread = (mean.abs() + var.sqrt()).max().item()  # the magnitude the sums run over
        bound = rounding_bound(torch.float32, size + max(counts), 1.0)
        got_mean, got_var = bn.running_mean.double(), bn.running_var.double()
        within((got_mean - mean).abs().max().item(), bound * spread, f'{n}.running_mean')
        within((got_var - var).abs().max().item(), bound * spread**2, f'{n}.running_var')


# ---------------------------------------------------------------- 5. ONNX export


def test_onnx_export_from_the_device_agrees_with_onnxruntime(device, tmp_path):
    """A folded PRepBN-Swin (linear attention, padded windows) exported while on the device;
    onnxruntime (CPU) against PyTorch on the device, both float32: each within the rounding
    bound of the folded model's sums, so their difference within twice it."""
    onnx = pytest.importorskip('onnx')
    pytest.importorskip('onnxruntime')
    from mmrepa.integrations.onnx import export_onnx, flatten_outputs, onnxruntime_session, run_onnx

    torch.manual_seed(0)
    model = reparameterize(randomize_(BACKBONES['prepbn_swin']()).eval().to(device))
    x = torch.randn(1, 3, 45, 67, device=device)
    path = str(tmp_path / 'prepbn_swin.onnx')
    with ieee_float32():
        export_onnx(model, x, path)
        assert on(model, device) and not model.training
        onnx.checker.check_model(path)
        with torch.no_grad():
            ref = [t.cpu() for t in flatten_outputs(model(x))]
    outs = [torch.from_numpy(o) for o in run_onnx(onnxruntime_session(path, threads=1), x)]
    size = summed_fan_in(model)
    assert_within(
        outs,
        ref,
        lambda r: 2 * rounding_bound(torch.float32, size, r.abs().max().item()),
        'onnxruntime',
    )
