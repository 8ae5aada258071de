"""Joined multi-branch ViT layers (the depth re-parameterization paper's §3.3): the training
forward against the paper's joins computed branch by branch, the exact fold at λ = 1 (and two
wrong folds that must fail), the refusal below 1, sizes against docs/backbones/depth_rep_vit.md
and the two checkpoint forms."""

import copy
import functools

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import mmrepa
from mmrepa.backbones.depth_rep_vit import (
    BranchSumLinear,
    JoinedAttention,
    JoinedBlock,
    JoinedFFN,
    stack_attention_branches,
    stack_ffn_branches,
    unstack_attention_branches,
    unstack_ffn_branches,
)
from mmrepa.errors import CheckpointError
from mmrepa.fold import FoldError
from mmrepa.utils.complexity import complexity
from tests.helpers import max_relative, reference_block

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 fold at 1e-5 ≈ 168·u32 of the output's scale: u32 times a size factor of the
# reductions (C, 4C, the tokens) in two orders; observed ≤ 0.022 of it on both kernel settings.

F64 = torch.float64
JOINS = ('logits', 'qkv')


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    """The tensors here are tiny: with a busy machine, intra-op threads only wait on each
    other (10x slower on two shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomized(module, seed=0):
    """Every parameter random, LN affine and every bias included (no fold term invisible)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=F64)
            p.copy_(
                1 + 0.3 * noise
                if name.endswith('norm1.weight') or name.endswith('norm2.weight')
                else 0.3 * noise
            )
    return module


def block(d=12, heads=2, n=2, join='logits', lam=1.0, seed=0, **kw):
    blk = JoinedBlock(d, heads, n, join, join_lambda=lam, **kw)
    return randomized(blk.to(F64), seed).eval()


# -------------------------------------------------------------- the wrong folds (controls)


def paper_eq67_attention(attn, u):
    """The paper's Eqs. 6-7, read literally: the (correct) joined softmax, but V and
    O summed separately, S·(Σ_b V_b)·(Σ_b W^O_b)."""
    B, N, d = u.shape
    H, n = attn.num_heads, attn.num_branches
    dh = d // H
    br = attn.branch_state_dicts()
    logits = 0
    for s in br:
        q, k, _ = (
            (u @ s['qkv.weight'].T + s['qkv.bias']).view(B, N, 3, H, dh).permute(2, 0, 3, 1, 4)
        )
        logits = logits + q @ k.transpose(-1, -2)
    S = (logits / (n * dh) ** 0.5).softmax(-1)
    w_qkv = sum(s['qkv.weight'] for s in br)
    b_qkv = sum(s['qkv.bias'] for s in br)
    v = (u @ w_qkv.T + b_qkv).view(B, N, 3, H, dh).permute(2, 0, 3, 1, 4)[2]
    heads = (S @ v).transpose(1, 2).reshape(B, N, d)
    return heads @ sum(s['proj.weight'] for s in br).T + sum(s['proj.bias'] for s in br)


def branch_first_fold(blk):
    """A folded logit-join block whose qkv/proj concatenate whole branch matrices
    branch-first ([all heads of branch 1 | all heads of branch 2 | ...])."""
    folded = copy.deepcopy(blk)
    folded.reparameterize()  # norms and FFN exact; the attention is then overwritten
    br = blk.attn.branch_state_dicts()
    d = blk.embed_dims
    with torch.no_grad():
        folded.attn.qkv.weight.copy_(
            torch.cat(
                [torch.cat([s['qkv.weight'][i * d : (i + 1) * d] for s in br]) for i in range(3)]
            )
        )
        folded.attn.qkv.bias.copy_(
            torch.cat(
                [torch.cat([s['qkv.bias'][i * d : (i + 1) * d] for s in br]) for i in range(3)]
            )
        )
        folded.attn.proj.weight.copy_(torch.cat([s['proj.weight'] for s in br], dim=1))
    return folded


# -------------------------------------------------------------- training forward


@pytest.mark.parametrize('join', JOINS)
@pytest.mark.parametrize('n', [1, 2, 3])
@pytest.mark.parametrize('lam', [0.0, 0.3, 0.99, 1.0])
def test_training_forward_is_the_spec_formula(join, n, lam):
    blk = block(d=12, heads=3, n=n, join=join, lam=lam, seed=n)
    x = torch.randn(2, 9, 12, dtype=F64)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, 6:] = False  # the second sample has 3 padding tokens
    ref = reference_block(blk, x, valid)
    assert max_relative(blk(x, key_padding_mask=valid), ref) < 1e-12


@pytest.mark.parametrize('join', JOINS)
def test_joined_forward_at_one_has_the_gradients_of_the_general_formula(join):
    """At λ = 1 the training forward runs the folded computation on weights summed on the fly;
    outputs and every branch's gradient equal the general joined formula's."""
    attn = randomized(JoinedAttention(12, 3, 3, join, join_lambda=1.0).to(F64))
    x = torch.randn(2, 7, 12, dtype=F64)

    def grads(fn):
        attn.zero_grad()
        out = fn()
        out.pow(2).sum().backward()
        return out.detach(), [p.grad.clone() for p in attn.parameters()]

    fast, g_fast = grads(lambda: attn(x))
    general = (
        (lambda: attn.branch_proj(attn._joined_logits(x, None)))
        if join == 'logits'
        else (lambda: attn.branch_proj(attn._per_branch(x, None, joined_qkv=True)))
    )
    slow, g_slow = grads(general)
    assert max_relative(fast, slow) < 1e-12
    assert all(max_relative(a, b) < 1e-11 for a, b in zip(g_fast, g_slow))
    ffn = randomized(JoinedFFN(12, 2.0, 3, join_lambda=1.0).to(F64))
    y = torch.randn(2, 7, 12, dtype=F64, requires_grad=True)
    fast = torch.autograd.grad(ffn(y).pow(2).sum(), [y, *ffn.parameters()])
    slow = torch.autograd.grad(ffn._branches(y, joined=True).pow(2).sum(), [y, *ffn.parameters()])
    assert all(max_relative(a, b) < 1e-11 for a, b in zip(fast, slow))


def test_independent_branches_are_timm_attentions_and_mlps():
    """λ = 0: the sub-layers are sums of n ordinary timm Attention / Mlp modules."""
    from timm.layers import Mlp
    from timm.models.vision_transformer import Attention

    attn = randomized(JoinedAttention(12, 3, 3, join_lambda=0.0).to(F64))
    ffn = randomized(JoinedFFN(12, 4.0, 3, join_lambda=0.0).to(F64))
    x = torch.randn(2, 8, 12, dtype=F64)
    ref_attn, ref_ffn = 0, 0
    for s in attn.branch_state_dicts():
        m = Attention(12, 3, qkv_bias=True).to(F64).eval()
        m.load_state_dict(s)
        ref_attn = ref_attn + m(x)
    for s in ffn.branch_state_dicts():
        m = Mlp(12, 48).to(F64)
        m.load_state_dict(s)
        ref_ffn = ref_ffn + m(x)
    assert max_relative(attn(x), ref_attn) < 1e-12
    assert max_relative(ffn(x), ref_ffn) < 1e-12


def test_stacked_layouts_round_trip():
    attn = JoinedAttention(12, 3, 3)
    ffn = JoinedFFN(12, 4.0, 3)
    for layer, stack, unstack in (
        (
            attn,
            functools.partial(stack_attention_branches, num_heads=3),
            functools.partial(unstack_attention_branches, num_heads=3, num_branches=3),
        ),
        (ffn, stack_ffn_branches, functools.partial(unstack_ffn_branches, num_branches=3)),
    ):
        state = {k: v for k, v in layer.state_dict().items() if k != 'join_lambda'}
        again = stack(unstack(state))
        assert state.keys() == again.keys()
        assert all(torch.equal(state[k], again[k]) for k in state)


def test_eval_reads_lambda_from_the_buffer_as_ema_copies_it():
    blk = block(lam=0.0)
    ema = copy.deepcopy(blk).eval()
    with torch.no_grad():  # what mmengine's EMA does: buffer copies, no set_join_lambda
        for buf in (ema.attn.join_lambda, ema.mlp.join_lambda):
            buf.copy_(torch.tensor(0.6, dtype=F64))
    blk.set_join_lambda(0.6)
    x = torch.randn(1, 6, 12, dtype=F64)
    assert torch.equal(ema(x), blk.eval()(x))


def test_branches_start_as_independent_linears():
    torch.manual_seed(0)
    proj = BranchSumLinear(64, 8, 4)
    assert proj.weight.abs().max() <= 64**-0.5 and proj.weight.abs().max() > 0.9 * 64**-0.5
    attn = JoinedAttention(48, 4, 2)
    attn.reset_branch_parameters('xavier_uniform')
    first, second = attn.branch_state_dicts()
    bound = (6 / (48 + 3 * 48)) ** 0.5  # one branch's qkv is (3d, d), not (3nd, d)
    assert 0.9 * bound < first['qkv.weight'].abs().max() <= bound
    assert not torch.equal(first['qkv.weight'], second['qkv.weight'])
    assert not torch.equal(first['proj.weight'], second['proj.weight'])
    ffn = JoinedFFN(16, 4.0, 3)
    ffn.reset_branch_parameters('trunc_normal', std=0.02)
    assert all(abs(s['fc2.weight'].std().item() - 0.02) < 0.004 for s in ffn.branch_state_dicts())


@pytest.mark.parametrize('join', JOINS)
@pytest.mark.parametrize('n', [1, 3])
def test_the_branch_forward_at_one_does_not_use_the_fold_arithmetic(join, n, monkeypatch):
    """``fast_joined_forward=False`` (what benchmarks check folds against): at λ = 1 the
    layers compute their branches and the join, the paper's formula, without the summed
    weights the fold also uses."""
    blk = block(d=12, heads=3, n=n, join=join, lam=1.0, seed=n, window_size=2)
    x = torch.randn(2, 15, 12, dtype=F64)
    ref = reference_block(blk, x, hw=(3, 5))

    def summed_weights(self, dtype=None):
        raise AssertionError('the branch forward used the fold arithmetic')

    for layer in (JoinedAttention, JoinedFFN):
        monkeypatch.setattr(layer, '_folded_tensors', summed_weights)
    blk.attn.fast_joined_forward = blk.mlp.fast_joined_forward = False
    with torch.no_grad():
        assert max_relative(blk(x, (3, 5)), ref) < 1e-12


# -------------------------------------------------------------- the fold


@settings(max_examples=40, deadline=None)
@given(
    join=st.sampled_from(JOINS),
    heads=st.integers(1, 3),
    head_dim=st.integers(2, 6),
    n=st.integers(1, 4),
    tokens=st.integers(1, 40),
    cls_token=st.booleans(),
    padding=st.booleans(),
    window=st.sampled_from([None, 2, 3]),
    seed=st.integers(0, 99),
)
def test_fold_is_exact_at_lambda_one(
    join, heads, head_dim, n, tokens, cls_token, padding, window, seed
):
    d = heads * head_dim
    g = torch.Generator().manual_seed(seed)
    if window is None:
        N, hw, valid = tokens + cls_token, None, None
        if padding:
            valid = torch.rand(2, N, generator=g) < 0.7
            valid[:, 0] = True  # every sample keeps one real token (its class token)
    else:  # windowed blocks take patch tokens only, on a map of any size
        hw = (1 + tokens % 7, 1 + tokens // 7)
        N, valid = hw[0] * hw[1], None
    blk = block(d, heads, n, join, lam=1.0, seed=seed, window_size=window)
    x = torch.randn(2, N, d, dtype=F64, generator=g) * 2 + 0.5
    with torch.no_grad():
        # the paper's per-branch formula, independent of the layer's code (at λ = 1 the
        # training forward already runs the folded computation on summed weights)
        ref = reference_block(blk, x, valid, hw)
        unfolded = blk(x, hw, valid)
        folded = mmrepa.reparameterize(blk)
        assert folded.deploy and folded.attn.deploy and folded.mlp.deploy
        out = folded(x, hw, valid)
    assert max_relative(unfolded, ref) <= 1e-10
    assert max_relative(out, ref) <= 1e-10
    assert max_relative(out, unfolded) <= 1e-10


@pytest.mark.parametrize('join', JOINS)
def test_folded_shapes(join):
    blk = block(d=12, heads=3, n=3, join=join)
    blk.reparameterize()
    w = 36 if join == 'logits' else 12
    assert dict((k, tuple(v.shape)) for k, v in blk.state_dict().items()) == {
        'norm1.weight': (12,),
        'norm1.bias': (12,),
        'norm2.weight': (12,),
        'norm2.bias': (12,),
        'attn.qkv.weight': (3 * w, 12),
        'attn.qkv.bias': (3 * w,),
        'attn.proj.weight': (12, w),
        'attn.proj.bias': (12,),
        'mlp.fc1.weight': (48, 12),
        'mlp.fc1.bias': (48,),
        'mlp.fc2.weight': (12, 48),
        'mlp.fc2.bias': (12,),
    }
    assert blk.attn.num_heads == 3  # logits: 3 heads of width 3·4, not 9 heads of 4


@pytest.mark.parametrize('join', JOINS)
def test_single_branch_folds_to_a_timm_vit_block(join):
    from timm.models.vision_transformer import Block

    blk = block(d=12, heads=3, n=1, join=join, lam=0.0)  # one branch: λ plays no part
    x = torch.randn(2, 10, 12, dtype=F64)
    ref = blk(x)
    blk.reparameterize()
    timm_block = (
        Block(12, 3, qkv_bias=True, norm_layer=functools.partial(nn.LayerNorm, eps=1e-6))
        .to(F64)
        .eval()
    )
    timm_block.load_state_dict(blk.state_dict())  # strict: the same keys and shapes
    assert max_relative(timm_block(x), ref) <= 1e-12


def test_float32_fold_is_close():
    blk = block(d=48, heads=4, n=3, lam=1.0).float()
    x = torch.randn(2, 20, 48)
    with torch.no_grad():
        ref = blk(x)
        blk.reparameterize()
        assert blk.attn.qkv.weight.dtype == torch.float32
        assert max_relative(blk(x), ref) < 1e-5


@pytest.mark.parametrize('n', [2, 3])
def test_wrong_folds_fail_the_same_comparison(n):
    """Negative controls: the paper's Eq. 6-7 (sum V and O) and a branch-first qkv layout."""
    blk = block(d=48, heads=4, n=n, join='logits', lam=1.0, seed=n)
    x = torch.randn(2, 24, 48, dtype=F64)
    with torch.no_grad():
        u = blk.norm1(x)
        exact, ref = blk.attn(u), blk(x)
        assert max_relative(paper_eq67_attention(blk.attn, u), exact) > 0.3  # measured 0.8-1.9
        wrong = branch_first_fold(blk)
        assert max_relative(wrong.attn(u), exact) > 0.3  # measured 1.1-1.5
        assert max_relative(wrong(x), ref) > 0.3
        folded = mmrepa.reparameterize(blk)
        assert max_relative(folded.attn(u), exact) <= 1e-10
        assert max_relative(folded(x), ref) <= 1e-10


def test_fold_is_idempotent():
    blk = block(n=3, join='qkv')
    blk.reparameterize()
    state = copy.deepcopy(blk.state_dict())
    blk.reparameterize()
    blk.attn.reparameterize()
    assert all(torch.equal(v, blk.state_dict()[k]) for k, v in state.items())


@pytest.mark.parametrize('join', JOINS)
@pytest.mark.parametrize('lam', [0.0, 0.5, 0.99])
def test_fold_refuses_below_one_and_names_block_and_lambda(join, lam):
    blk = block(n=2, join=join, lam=lam)
    state = copy.deepcopy(blk.state_dict())
    with pytest.raises(FoldError, match=rf"JoinedBlock\(.*join='{join}'\).*join_lambda = {lam}"):
        blk.reparameterize()
    assert not blk.deploy and not blk.attn.deploy and not blk.mlp.deploy  # nothing folded
    assert all(torch.equal(v, blk.state_dict()[k]) for k, v in state.items())
    with pytest.raises(FoldError, match=rf'blocks\.1\.attn .*join_lambda = {lam}'):
        mmrepa.reparameterize(nn.ModuleDict(dict(blocks=nn.Sequential(block(), blk))).eval())


# ------------------------------------------------- sizes (docs/backbones/depth_rep_vit.md#sizes)

D, HEADS, N197 = 192, 12, 197
FIXED_PARAMS = 379_048
FIXED_MACS = 196 * 768 * 192 + 192 * 1000 + 5 * 192


def block_params(n, w=None, folded=True, d=D):
    if folded:
        return 4 * d + (3 * d * w + 3 * w) + (w * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return 4 * d + n * (block_params(1, d, d=d) - 4 * d)  # shared LNs, n branches


def block_macs(n, w=None, folded=True, full=True, d=D, N=N197):
    if folded:
        return N * d * 3 * w + N * w * d + 8 * N * d * d + 10 * N * d + full * 2 * N * N * w
    return n * (block_macs(1, d, d=d, N=N, full=full) - 10 * N * d) + 10 * N * d


@pytest.mark.parametrize(
    'n, params_train, params_logits, params_qkv, macs',
    [
        (2, 5_712_808, 3_936_424, 3_048_232, ((1077.1, 1256.0), (728.5, 907.4), (554.2, 643.7))),
        (3, 5_711_272, 3_342_760, 2_158_504, ((1076.4, 1255.2), (611.6, 790.4), (379.2, 438.8))),
        (4, 5_710_504, 3_045_928, 1_713_640, ((1076.0, 1254.8), (553.1, 731.9), (291.7, 336.4))),
    ],
)
def test_vit_tiny_block_sizes_match_spec(n, params_train, params_logits, params_qkv, macs):
    """Parameters and MACs ("full", mmrepa's complexity with SDPA) of one ViT-Tiny block
    (192 dims, 12 heads, N = 197) before and after folding equal the formulas above exactly;
    12 / n blocks plus the fixed parts give the model table of
    docs/backbones/depth_rep_vit.md#sizes."""
    depth = 12 // n
    x = torch.randn(1, N197, D)
    for join, w, model_params, model_macs in (
        ('logits', n * D, params_logits, macs[1]),
        ('qkv', D, params_qkv, macs[2]),
    ):
        blk = JoinedBlock(D, HEADS, n, join, join_lambda=0.0).eval()
        before = complexity(blk, (x,))
        assert before == dict(
            params=block_params(n, folded=False), macs=block_macs(n, folded=False)
        )
        blk.set_join_lambda(1.0)
        blk.reparameterize()
        after = complexity(blk, (x,))
        assert after == dict(params=block_params(n, w), macs=block_macs(n, w))
        assert after == complexity(JoinedBlock(D, HEADS, n, join, deploy=True).eval(), (x,))
        # the model table (MACs in millions, as rounded there)
        assert depth * before['params'] + FIXED_PARAMS == params_train
        assert depth * after['params'] + FIXED_PARAMS == model_params
        for full in (False, True):
            train = depth * block_macs(n, folded=False, full=full) + FIXED_MACS
            deployed = depth * block_macs(n, w, full=full) + FIXED_MACS
            assert round(train / 1e6, 1) == macs[0][full]
            assert round(deployed / 1e6, 1) == model_macs[full]


# -------------------------------------------------------------- the two checkpoint forms


@pytest.mark.parametrize('join', JOINS)
@pytest.mark.parametrize('n', [1, 2, 3])
def test_deploy_builds_the_folded_structure(join, n):
    folded = block(d=12, heads=3, n=n, join=join)
    x = torch.randn(2, 5, 12, dtype=F64)
    ref = folded(x)
    folded.reparameterize()
    built = JoinedBlock(12, 3, n, join, deploy=True).to(F64)
    assert {k: v.shape for k, v in built.state_dict().items()} == {
        k: v.shape for k, v in folded.state_dict().items()
    }
    built.load_state_dict(folded.state_dict())  # strict
    assert max_relative(built(x), ref) <= 1e-12
    with pytest.raises(ValueError, match='folded'):
        built.set_join_lambda(0.5)
    built.set_join_lambda(1.0)  # the folded block is the λ = 1 network


@pytest.mark.parametrize('join', JOINS)
def test_a_checkpoint_of_the_other_form_is_refused(join):
    unfolded = block(n=2, join=join)
    folded = JoinedBlock(12, 2, 2, join, deploy=True).to(F64)
    with pytest.raises(CheckpointError, match='unfolded weights .*deploy=True'):
        folded.load_state_dict(unfolded.state_dict())
    with pytest.raises(CheckpointError, match='folded weights'):
        unfolded.load_state_dict(folded.state_dict())
    for cls, args in ((JoinedAttention, (12, 2, 2, join)), (JoinedFFN, (12, 4.0, 2))):
        training, deployed = cls(*args), cls(*args, deploy=True)
        with pytest.raises(CheckpointError):
            deployed.load_state_dict(training.state_dict())
        with pytest.raises(CheckpointError):
            training.load_state_dict(deployed.state_dict())


def test_lambda_is_saved_and_restored():
    blk = block(lam=0.25)
    restored = block(lam=0.0, seed=1)
    restored.load_state_dict(blk.state_dict())
    assert restored.current_join_lambda == restored.mlp.scheduled_value == 0.25
    x = torch.randn(1, 4, 12, dtype=F64)
    assert torch.equal(restored.train()(x), blk.train()(x))
    with pytest.raises(ValueError, match=r'\[0, 1\]'):
        blk.set_join_lambda(1.5)
