"""RepBN, PRepBN, simplified linear attention and the folds of the norms into their neighbours."""

import copy

import pytest
import torch
import torch.nn.functional as F

from mmrepa import reparameterize
from mmrepa.backbones.swin import FoldablePatchMerging, RePaSwinBlock, ShiftWindowMSA
from mmrepa.engine.hooks.prepbn_schedule_hook import PRepBNScheduleHook, prepbn_lambda
from mmrepa.fold import norm_affine
from mmrepa.layers import (
    FoldablePatchEmbed,
    PRepBN,
    RepBN,
    SimplifiedLinearAttention,
)
from tests.helpers import max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 attention fold at 1e-4 ≈ 1680·u32 of the output's scale: a size factor of the
# reductions (C per projection, the window's tokens per attention sum) in two orders, through
# a softmax or a linear-attention normaliser; observed ≤ 0.002 of it.


def prepbn(C, lam=0.5, dtype=torch.float64):
    return randomize_(PRepBN(C, lam=lam)).to(dtype)


def test_repbn_is_batchnorm_plus_eta_x_and_its_eval_affine_matches():
    norm = randomize_(RepBN(6)).double()
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    bn = norm.bn
    for training in (True, False):
        norm.train(training)
        expected = F.batch_norm(
            x.reshape(-1, 6),
            bn.running_mean.clone(),
            bn.running_var.clone(),
            bn.weight,
            bn.bias,
            training,
            0.0,
            bn.eps,
        ).view(x.shape)
        assert max_abs_diff(norm(x), expected + norm.eta * x) <= 1e-12
    scale, shift = norm.eval_affine(torch.float64)
    assert max_abs_diff(x * scale + shift, norm.eval()(x)) <= 1e-12


@pytest.mark.parametrize('lam', [0.0, 0.3, 1.0])
def test_prepbn_eval_is_repbn_for_any_lambda(lam):
    norm = prepbn(8, lam).eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    assert torch.equal(norm(x), norm.repbn(x))
    scale, shift = norm_affine(norm, torch.float64)
    assert max_abs_diff(x * scale + shift, norm(x)) <= 1e-12


def test_prepbn_training_mixes_layernorm_and_repbn():
    norm = prepbn(8, 0.3).train()
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    ref = copy.deepcopy(norm)
    expected = 0.3 * ref.ln(x) + 0.7 * ref.repbn(x)
    assert max_abs_diff(norm(x), expected) <= 1e-12
    norm.set_lambda(1.0)
    assert max_abs_diff(norm(x), norm.ln(x)) == 0  # warm-up: pure LayerNorm


def test_prepbn_skips_the_layernorm_once_lambda_is_zero(monkeypatch):
    norm = prepbn(8, 0.2).train()
    calls = []
    monkeypatch.setattr(norm.ln, 'forward', lambda x: calls.append(1) or x)
    x = torch.randn(5, 8, dtype=torch.float64)
    norm(x)
    assert calls == [1]
    norm.set_lambda(0.0)
    assert torch.equal(norm(x), norm.repbn(x)) and calls == [1]


def test_prepbn_lambda_is_module_state():
    norm = PRepBN(4)
    norm.set_lambda(0.25)
    state = norm.state_dict()
    assert float(state['lam']) == 0.25
    other = PRepBN(4)
    other.load_state_dict(state)
    assert other.current_lambda == 0.25 and float(copy.deepcopy(other).lam) == 0.25
    with pytest.raises(ValueError, match=r'PRepBN: lam must be in \[0, 1\], got 1.5'):
        norm.set_lambda(1.5)


def test_prepbn_lambda_is_untouched_by_forward_and_backward():
    norm = prepbn(8, 0.4, torch.float32).train()
    x = torch.randn(3, 8, requires_grad=True)
    for _ in range(3):
        norm(x).sum().backward()
    assert norm.current_lambda == 0.4 and float(norm.lam) == pytest.approx(0.4)


def test_schedule_values():
    values = [prepbn_lambda(it, warmup_iters=2, decay_iters=4) for it in range(8)]
    assert values == [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert prepbn_lambda(5, warmup_iters=5, decay_iters=0) == 0.0
    assert prepbn_lambda(4, warmup_iters=5, decay_iters=0) == 1.0


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(), 'exactly one of decay_iters'),
        (dict(decay_iters=3, decay_ratio=0.5), 'exactly one of decay_iters'),
        (dict(decay_ratio=1.5), r'decay_ratio must be in \[0, 1\]'),
        (dict(warmup_iters=-1, decay_iters=3), 'warmup_iters must be an integer >= 0'),
    ],
)
def test_schedule_hook_options_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PRepBNScheduleHook(**kwargs)


# ---- folds -----------------------------------------------------------------------------------


def test_patch_embed_fold_scales_the_conv_bias():
    embed = (
        randomize_(
            FoldablePatchEmbed(
                in_channels=3, embed_dims=8, kernel_size=4, stride=4, norm_cfg=dict(type='PRepBN')
            )
        )
        .double()
        .eval()
    )
    assert embed.projection.bias.abs().min() > 0  # a fold that forgot the bias would show
    x = torch.randn(2, 3, 31, 45, dtype=torch.float64)  # adaptive padding on both sides
    ref, shape = embed(x)
    reparameterize(embed)
    assert embed.norm is None and embed.deploy
    out, shape2 = embed(x)
    assert shape == shape2 == (8, 12)
    assert max_abs_diff(out, ref) <= 1e-10


def test_patch_merging_fold_gives_the_reduction_a_bias():
    merge = (
        randomize_(
            FoldablePatchMerging(in_channels=4, out_channels=8, norm_cfg=dict(type='PRepBN'))
        )
        .double()
        .eval()
    )
    assert merge.reduction.bias is None
    x = torch.randn(2, 7 * 9, 4, dtype=torch.float64)  # odd map: padded before the norm
    ref, shape = merge(x, (7, 9))
    reparameterize(merge)
    assert merge.norm is None and merge.reduction.bias is not None
    out, shape2 = merge(x, (7, 9))
    assert shape == shape2 == (4, 5)
    assert max_abs_diff(out, ref) <= 1e-10
    reparameterize(merge)  # idempotent
    assert max_abs_diff(merge(x, (7, 9))[0], ref) <= 1e-10


def _norm_then_attention(attn_type, shift, dtype, qkv_bias=True):
    """A Swin block whose ``norm1`` is a PRepBN: its fold puts the norm into ``attn``."""
    block = RePaSwinBlock(
        8,
        2,
        4,
        shift=shift,
        ffn_cfg=dict(idle_ratio=0.5),
        qkv_bias=qkv_bias,
        norm_cfg=dict(type='BN1d'),
        attn_type=attn_type,
    )
    block = randomize_(block).to(dtype).eval()
    block.norm1 = prepbn(8, 0.5, dtype).eval()
    return block


@pytest.mark.parametrize('attn_type', ['S', 'L'])
@pytest.mark.parametrize('shift', [False, True])
def test_attention_fold_is_exact_where_windows_pad(attn_type, shift):
    block = _norm_then_attention(attn_type, shift, torch.float64)
    hw = (9, 6)  # padded to 12 x 8: a third of the windows' tokens are padding
    x = torch.randn(2, 9 * 6, 8, dtype=torch.float64)
    ref = block.attn(block.norm1(x), hw)
    block.reparameterize()
    assert block.norm1 is None
    assert max_abs_diff(block.attn(x, hw), ref) <= 1e-10
    # the trap: padding the folded map with zero tokens (qkv of 0 = the folded bias)
    block.attn.padded_qkv = None
    assert max_abs_diff(block.attn(x, hw), ref) > 1e-3


@pytest.mark.parametrize('attn_type', ['S', 'L'])
def test_attention_fold_is_close_in_float32(attn_type):
    block = _norm_then_attention(attn_type, True, torch.float32)
    x = torch.randn(2, 9 * 6, 8)
    ref = block.attn(block.norm1(x), (9, 6))
    block.reparameterize()
    out = block.attn(x, (9, 6))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_attention_fold_adds_a_qkv_bias_when_there_was_none():
    block = _norm_then_attention('S', False, torch.float64, qkv_bias=False)
    x = torch.randn(1, 5 * 7, 8, dtype=torch.float64)
    ref = block.attn(block.norm1(x), (5, 7))
    block.reparameterize()
    assert block.attn.w_msa.qkv.bias is not None
    assert max_abs_diff(block.attn(x, (5, 7)), ref) <= 1e-10


# ---- simplified linear attention ------------------------------------------------------------


def test_linear_attention_matches_the_quadratic_formula():
    sla = randomize_(SimplifiedLinearAttention(8, 2, window_size=3)).double()
    x = torch.randn(4, 9, 8, dtype=torch.float64)
    qkv = sla.qkv(x)
    q, k, v = qkv.split(8, dim=-1)
    k = k + sla.positional_encoding
    out = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)
        sim = F.relu(q[..., sl]) @ F.relu(k[..., sl]).transpose(1, 2)  # 4, 9, 9
        attn = sim @ v[..., sl] / (sim.sum(-1, keepdim=True) + 1e-6)
        vmap = v[..., sl].transpose(1, 2).reshape(4, 4, 3, 3)
        local = F.conv2d(vmap, sla.dwc.weight, sla.dwc.bias, padding=2, groups=4)
        out.append(attn + local.reshape(4, 4, 9).transpose(1, 2))
    expected = sla.proj(torch.cat(out, dim=-1))
    assert max_abs_diff(sla(x), expected) <= 1e-12


def test_linear_attention_normaliser_keeps_silent_queries_finite():
    sla = SimplifiedLinearAttention(4, 1, window_size=2)
    with torch.no_grad():
        sla.qkv.weight.zero_()
        sla.qkv.bias.copy_(torch.tensor([-1.0] * 4 + [1.0] * 8))  # relu(Q) = 0 everywhere
    out = sla.attend(sla.qkv(torch.randn(3, 4, 4)))
    assert torch.isfinite(out).all()


def test_linear_attention_kernel_runs_in_float32_for_half_inputs(monkeypatch):
    sla = randomize_(SimplifiedLinearAttention(8, 2, window_size=4)).bfloat16()
    matmul_dtypes = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        matmul_dtypes.append((a.dtype, b.dtype))
        return original(a, b)

    monkeypatch.setattr(torch.Tensor, '__matmul__', spy)
    out = sla.attend(torch.randn(2, 16, 24, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert matmul_dtypes and all(d == (torch.float32, torch.float32) for d in matmul_dtypes)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(embed_dims=6, num_heads=4), 'divisible by num_heads'),
        (dict(dwc_kernel_size=4), 'must be odd'),
    ],
)
def test_linear_attention_options_say_what_is_wrong(kwargs, message):
    kwargs = dict(dict(embed_dims=8, num_heads=2, window_size=4), **kwargs)
    with pytest.raises(ValueError, match=message):
        SimplifiedLinearAttention(**kwargs)


def test_unknown_attention_type_says_what_is_expected():
    with pytest.raises(ValueError, match=r"attn_type must be 'S' \(softmax\) or 'L'"):
        ShiftWindowMSA(8, 2, window_size=4, attn_type='X')
