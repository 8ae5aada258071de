"""FoldableFSDPStrategy's mixed precision: what it does to the model before FSDP wraps it.
Training under FSDP in bfloat16 is tests/integration/test_fsdp.py's."""

import pytest
import torch
import torch.nn as nn

from mmrepa.engine.strategies import Float32AffineBatchNorm, mixed_precision_for
from mmrepa.errors import ConfigError

BF16 = dict(param_dtype='bfloat16', reduce_dtype='bfloat16', buffer_dtype='float32')
# unit roundoffs (round to nearest): bfloat16 keeps 8 significant bits, float32 24. On CPUs with
# native bfloat16 (AVX-512 BF16, AMX) torch still computes these elementwise and normalisation
# kernels in float32 and rounds once to nearest, so the bounds below hold there too.
U_BF16, U_FP32 = 2.0**-8, 2.0**-24


def within(got, ref, bound):
    """Every entry of ``got`` (any dtype) within its entry of ``bound`` of float64 ``ref``."""
    excess = (got.double() - ref).abs() - bound
    assert excess.max() <= 0, f'{excess.max().item():.3g} past the bound'


def bf16_bound(ref, terms, n):
    """A float32 computation rounded once to bfloat16: |fl(z) - z| <= u|z| for the rounding,
    plus the float32 error, (n + 8)·u32 × ``terms`` (the sum of the absolute values of the
    products and summands that make ``ref``; n = the longest reduction, its summation error
    γ_n; 8 for the few ops after it) and, at first order, |z| ≈ |ref|."""
    return U_BF16 * ref.abs() + (n + 8) * U_FP32 * terms


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
    # the output computed in float32 and rounded once to bfloat16 (bf16_bound, n = the batch);
    # the statistics float32: the batch mean and variance are sums of n terms (γ_n ≈ n·u32
    # of the sum of their absolute values, Welford's the same order), then one momentum step.
    # A wrong statistic is far past: the unbiased variance in y exceeds the bound 130-fold,
    # the biased one in the running variance 2000-fold.
    n, mom = x.shape[0], 1.0 if momentum is None else momentum
    t = x.double()
    m, s = t.mean(0), torch.sqrt(t.var(0, unbiased=False) + bn.eps)
    within(y, ref, bf16_bound(ref, ((t - m) / s * bn.weight.double()).abs() + bn.bias.abs(), n))
    mean_terms = (1 - mom) * mean.double().abs() + mom * t.abs().mean(0)
    within(bn.running_mean, ref_mean, (n + 8) * U_FP32 * mean_terms)
    var_terms = (1 - mom) * var.double() + mom * (t - m).square().mean(0) * n / (n - 1)
    within(bn.running_var, ref_var, (n + 8) * U_FP32 * var_terms)
    assert int(bn.num_batches_tracked) == 1
    bn.eval()  # the running statistics, not the batch's
    expect = (x.double() - bn.running_mean.double()) / torch.sqrt(bn.running_var.double() + 1e-5)
    expect = expect * bn.weight.double()
    terms = expect.abs() + bn.bias.abs()  # no reduction: n = 0
    expect = expect + bn.bias.double()
    within(bn(x), expect, bf16_bound(expect, terms, 0))


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
    ln = ln * layer.ln.weight.double()
    ln_terms = ln.abs() + layer.ln.bias.abs()
    ln = ln + layer.ln.bias.double()
    bn = (t - t.mean(0)) / torch.sqrt(t.var(0, unbiased=False) + 1e-5)
    bn = bn * layer.repbn.bn.weight.double()
    bn_terms = bn.abs() + layer.repbn.bn.bias.abs()
    bn = bn + layer.repbn.bn.bias.double()
    skip = layer.repbn.eta.double() * t
    ref = 0.3 * ln + 0.7 * (bn + skip)
    # seven roundings to bfloat16, each u·|its value|: LN(x), 0.3·LN, BN(x), η·x, BN + η·x,
    # 0.7·(…), the sum; plus the float32 error inside LN and BN (bf16_bound's, n = 20 tokens
    # for the BatchNorm, 8 channels for the LayerNorm), all at first order (× (1 + 4u) for
    # the rest). Leaving out η·x, or 0.3 for λ = 0.29, exceeds it.
    rounding = 0.6 * ln.abs() + 0.7 * (bn.abs() + skip.abs()) + 1.4 * (bn + skip).abs() + ref.abs()
    float32 = (20 + 8) * U_FP32 * (0.3 * ln_terms + 0.7 * bn_terms)
    within(y.reshape(-1, 8), ref, (1 + 4 * U_BF16) * U_BF16 * rounding + float32)


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
    scaled = (x.double() - m) / torch.sqrt(v + bn.eps) * bn.weight.double()
    ref = scaled + bn.bias.double()
    within(y, ref, bf16_bound(ref, scaled.abs() + bn.bias.abs(), x.shape[0]))
    after = bn.state_dict()
    assert all(torch.equal(after[k].float(), before[k].float()) for k in before if 'running' in k)
    assert all(torch.equal(after[k], before[k]) for k in before if 'num_batches' in k)
