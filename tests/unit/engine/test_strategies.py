"""FoldableFSDPStrategy's mixed precision: what it does to the model before FSDP wraps it.
Training under FSDP in bfloat16 is tests/integration/test_fsdp.py's."""

import pytest
import torch
import torch.nn as nn

from mmrepa.engine.strategies import Float32AffineBatchNorm, mixed_precision_for
from mmrepa.errors import ConfigError

BF16 = dict(param_dtype='bfloat16', reduce_dtype='bfloat16', buffer_dtype='float32')


def naive_batchnorm(x, weight, bias, mean, var, momentum, eps):
    """Training-mode BatchNorm over dim 0 written out in float64: (output, new mean, new var)."""
    x = x.double()
    m, v = x.mean(0), x.var(0, unbiased=False)
    y = (x - m) / torch.sqrt(v + eps) * weight.double() + bias.double()
    n = x.shape[0]
    return (
        y,
        (1 - momentum) * mean.double() + momentum * m,
        (1 - momentum) * var.double() + momentum * v * n / (n - 1),
    )


@pytest.mark.parametrize('momentum', [0.1, None])
def test_batchnorm_computes_with_float32_statistics_on_bf16_weights(momentum):
    """As FSDP leaves it in the forward pass (weight and bias bfloat16, statistics float32,
    bfloat16 input), the BatchNorm normalises with float32 statistics and updates them in
    float32; torch's own BatchNorm refuses those dtypes."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=momentum))
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(6, generator=g))
        bn.running_var.copy_(torch.rand(6, generator=g) + 0.5)
        bn.weight.copy_(torch.randn(6, generator=g))
        bn.bias.copy_(torch.randn(6, generator=g))
    x = (torch.randn(64, 6, generator=g) * 3 + 1).bfloat16()
    mean, var = bn.running_mean.clone(), bn.running_var.clone()
    bn.weight.data, bn.bias.data = bn.weight.data.bfloat16(), bn.bias.data.bfloat16()
    with pytest.raises(RuntimeError):
        bn(x)
    bn.num_batches_tracked.zero_()
    mp = mixed_precision_for(model, BF16)
    assert isinstance(bn, Float32AffineBatchNorm) and isinstance(bn, nn.BatchNorm1d)
    assert mp['_module_classes_to_ignore'] == ()  # FSDP would wrap every BatchNorm alone
    y = bn(x)
    # momentum None: a cumulative average, 1 / 1 for the first batch
    ref, ref_mean, ref_var = naive_batchnorm(
        x, bn.weight, bn.bias, mean, var, 1.0 if momentum is None else momentum, bn.eps
    )
    assert y.dtype == torch.bfloat16 and bn.running_mean.dtype == torch.float32
    # the output rounded to bfloat16 (8 significant bits), the statistics float32
    assert torch.allclose(y.double(), ref, rtol=2**-8, atol=2**-8)
    assert torch.allclose(bn.running_mean.double(), ref_mean, rtol=1e-6, atol=1e-6)
    assert torch.allclose(bn.running_var.double(), ref_var, rtol=1e-6, atol=1e-6)
    assert int(bn.num_batches_tracked) == 1
    bn.eval()  # the running statistics, not the batch's
    expect = (x.double() - bn.running_mean.double()) / torch.sqrt(bn.running_var.double() + 1e-5)
    expect = expect * bn.weight.double() + bn.bias.double()
    assert torch.allclose(bn(x).double(), expect, rtol=2**-8, atol=2**-8)


def test_full_precision_leaves_the_model_alone():
    model = nn.Sequential(nn.BatchNorm2d(3))
    mixed_precision_for(model, dict(param_dtype='float32'))
    assert type(model[0]) is nn.BatchNorm2d


@pytest.mark.parametrize(
    'mp, module, message',
    [
        (dict(BF16, buffer_dtype='bfloat16'), nn.BatchNorm1d(2), "buffer_dtype='float32'"),
        (BF16, nn.SyncBatchNorm(2), '0 is a SyncBatchNorm'),
    ],
)
def test_what_mixed_precision_cannot_keep_float32_is_refused(mp, module, message):
    with pytest.raises(ConfigError, match=message) as e:
        mixed_precision_for(nn.Sequential(module), mp)
    assert '\n' not in str(e.value)


def test_prepbn_under_bf16_weights_keeps_lambda_and_statistics_float32():
    """PRepBN as FSDP runs it in bfloat16 (its weights cast, its buffers not): it computes
    λ·LN(x) + (1 − λ)·(BN(x) + η·x), written out here in float64, to bfloat16's rounding."""
    from mmrepa.layers import PRepBN

    g = torch.Generator().manual_seed(0)
    layer = PRepBN(8, lam=0.3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    mixed_precision_for(layer, BF16)
    for p in layer.parameters():
        p.data = p.data.bfloat16()
    x = (torch.randn(4, 5, 8, generator=g) * 2).bfloat16()
    y = layer(x)
    assert y.dtype == torch.bfloat16
    assert layer.lam.dtype == layer.repbn.bn.running_var.dtype == torch.float32
    t = x.double().reshape(-1, 8)
    ln = (t - t.mean(1, keepdim=True)) / torch.sqrt(t.var(1, unbiased=False, keepdim=True) + 1e-5)
    ln = ln * layer.ln.weight.double() + layer.ln.bias.double()
    bn = (t - t.mean(0)) / torch.sqrt(t.var(0, unbiased=False) + 1e-5)
    bn = bn * layer.repbn.bn.weight.double() + layer.repbn.bn.bias.double()
    ref = 0.3 * ln + 0.7 * (bn + layer.repbn.eta.double() * t)
    assert torch.allclose(y.double().reshape(-1, 8), ref, rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize('built_untracked', [False, True])
def test_batchnorm_without_tracked_statistics_normalises_by_the_batch(built_untracked):
    """Built with track_running_stats=False (no buffers), or switched off later (buffers kept):
    the batch's statistics, float32 weights, and buffers left as they were, as torch does."""
    g = torch.Generator().manual_seed(1)
    bn = nn.BatchNorm1d(6, track_running_stats=not built_untracked)
    with torch.no_grad():
        bn.weight.copy_(torch.randn(6, generator=g))
        bn.bias.copy_(torch.randn(6, generator=g))
    bn.track_running_stats = False
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    mixed_precision_for(nn.Sequential(bn), BF16)
    bn.weight.data, bn.bias.data = bn.weight.data.bfloat16(), bn.bias.data.bfloat16()
    x = (torch.randn(64, 6, generator=g) * 3 + 1).bfloat16()
    y = bn(x)
    m, v = x.double().mean(0), x.double().var(0, unbiased=False)
    ref = (x.double() - m) / torch.sqrt(v + bn.eps) * bn.weight.double() + bn.bias.double()
    assert torch.allclose(y.double(), ref, rtol=2**-8, atol=2**-8)
    after = bn.state_dict()
    assert all(torch.equal(after[k].float(), before[k].float()) for k in before if 'running' in k)
    assert all(torch.equal(after[k], before[k]) for k in before if 'num_batches' in k)
