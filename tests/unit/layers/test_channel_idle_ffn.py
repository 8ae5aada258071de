import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrepa import reparameterize
from mmrepa.backbones.metaformer import StarReLU
from mmrepa.layers import ChannelIdleFFN, activate_first_, num_active_channels
from tests.helpers import max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 fold comparisons: u32 = 2^-24 times the size factor C + 4C (fc1's and fc2's
# reductions) of the output's scale, or 1e-5 ≈ 168·u32 of it; observed ≤ 0.06 of either on both
# kernel settings.

NORMS = {
    'BN': dict(norm_cfg=dict(type='BN1d'), hidden_norm_cfg=dict(type='BN1d')),
    'LN': dict(norm_cfg=dict(type='LN'), hidden_norm_cfg=None),
}


def make(C=24, idle=0.75, norm='BN', dtype=torch.float64, **kw):
    ffn = ChannelIdleFFN(C, idle_ratio=idle, **NORMS[norm], **kw)
    return randomize_(ffn).to(dtype).eval()


@pytest.mark.parametrize('norm', ['BN', 'LN'])
@pytest.mark.parametrize('idle', [0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_fold_is_exact_in_float64(norm, idle):
    ffn = make(idle=idle, norm=norm)
    x = torch.randn(3, 37, 24, dtype=torch.float64) * 2 + 0.5
    ref = ffn(x)
    folded = reparameterize(copy.deepcopy(ffn))
    assert folded.deploy
    assert max_abs_diff(folded(x), ref) <= 1e-10


@pytest.mark.parametrize('norm', ['BN', 'LN'])
@pytest.mark.parametrize('idle', [0.0, 0.75, 1.0])
def test_fold_is_close_in_float32(norm, idle):
    ffn = make(C=40, idle=idle, norm=norm, dtype=torch.float32)
    x = torch.randn(2, 5, 11, 40)  # any leading shape
    ref = ffn(x)
    folded = reparameterize(copy.deepcopy(ffn))
    # two float32 forwards of one function, summing in other orders: each within γ_n ≈ n·u32 of
    # the magnitudes it sums, n = C for fc1 plus 4C for fc2, at the output's scale (was atol
    # 1e-5 whatever the scale: 0.8 of it used here; now 0.08 on either kernel setting)
    tol = (40 + 4 * 40) * 2**-24 * ref.abs().max().item()
    torch.testing.assert_close(folded(x), ref, rtol=0, atol=tol)


def test_folded_form_is_one_wide_gemm_then_one_from_the_active_slice():
    C, h = 32, 128
    ffn = reparameterize(make(C=C, idle=0.75))
    a = num_active_channels(h, 0.75)
    assert a == 32
    assert tuple(ffn.in_proj.weight.shape) == (a + C, C)
    assert tuple(ffn.out_proj.weight.shape) == (C, a)
    assert ffn.out_proj.bias is None  # the bias lives in in_proj's linear part
    assert {n for n, _ in ffn.named_children()} == {'act', 'in_proj', 'out_proj'}


def test_activation_sees_only_the_active_slice():
    ffn = make(C=16, idle=0.75).float()
    widths = []
    ffn.act.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[-1]))
    ffn(torch.randn(2, 7, 16))
    reparameterize(ffn)
    ffn(torch.randn(2, 7, 16))
    assert widths == [16, 16]  # ceil(64 * 0.25), before and after folding


@pytest.mark.parametrize('act', [torch.nn.GELU(), StarReLU(scale_value=0.8, bias_value=-0.3)])
@pytest.mark.parametrize('active', [0, 3, 8])
@pytest.mark.parametrize(
    'fresh', [lambda x: x * 1.0, lambda x: (x * 1.0).transpose(0, 1)], ids=['tensor', 'view']
)
def test_in_place_partial_activation_matches_slice_and_cat(act, active, fresh):
    act = act.double()
    h = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, 8, dtype=torch.float64)

    def grads(fn):
        for p in act.parameters():
            p.grad = None
        h.grad = None
        fn(fresh(h)).backward(fresh(grad))  # fresh, as a linear layer's output is
        return [h.grad] + [p.grad for p in act.parameters()]

    ref = grads(lambda x: torch.cat([act(x[..., :active]), x[..., active:]], -1))
    out = grads(lambda x: activate_first_(act, x, active))
    assert torch.equal(
        activate_first_(act, h.detach().clone(), active),
        torch.cat([act(h[..., :active]), h[..., active:]], -1).detach(),
    )
    for r, o in zip(ref, out):
        if o is None:  # no active channel: the activation is not called
            assert active == 0 and not r.any()
        else:
            assert max_abs_diff(r, o) < 1e-12
    if active:
        torch.autograd.gradcheck(
            lambda x, *p: activate_first_(act, fresh(x), active), (h, *act.parameters())
        )


@pytest.mark.parametrize('C', [96, 128])
def test_fold_removes_five_c_squared_weights_at_075(C):
    ffn = make(C=C, idle=0.75)
    before = ffn.fc1.weight.numel() + ffn.fc2.weight.numel()
    reparameterize(ffn)
    after = ffn.in_proj.weight.numel() + ffn.out_proj.weight.numel()
    assert before - after == 5 * C * C
    # the paper's ratio: 1 - theta + 1 / (2 rho) = 0.375 of the FFN weights remain
    assert after / before == pytest.approx(0.375)


def test_deploy_round_trip_and_idempotence():
    ffn = make(idle=0.5)
    x = torch.randn(4, 9, 24, dtype=torch.float64)
    ref = ffn(x)
    reparameterize(ffn)
    state = copy.deepcopy(ffn.state_dict())
    reparameterize(ffn)  # second call changes nothing
    for k, v in ffn.state_dict().items():
        assert torch.equal(v, state[k])
    fresh = ChannelIdleFFN(24, idle_ratio=0.5, deploy=True).double().eval()
    fresh.load_state_dict(state)
    assert max_abs_diff(fresh(x), ref) <= 1e-10


def test_invalid_idle_ratio_names_the_option():
    with pytest.raises(ValueError, match=r'idle_ratio must be in \[0, 1\]'):
        ChannelIdleFFN(8, idle_ratio=1.5)


def test_active_channel_count_is_robust_to_float_noise():
    assert num_active_channels(40, 0.9) == 4  # 40 * 0.1 = 4.000000000000001
    assert num_active_channels(384, 0.75) == 96
    assert num_active_channels(384, 0.7) == math.ceil(384 * 0.3 - 1e-9)
    assert num_active_channels(10, 0.0) == 10 and num_active_channels(10, 1.0) == 0


def test_drop_path_and_dropout_are_identity_at_eval_and_train_path_runs():
    ffn = ChannelIdleFFN(16, drop_rate=0.1, drop_path_rate=0.2)
    x = torch.randn(4, 6, 16, requires_grad=True)
    ffn(x).sum().backward()
    assert x.grad is not None and ffn.fc1.weight.grad is not None
    plain = ChannelIdleFFN(16)
    plain.load_state_dict(ffn.state_dict())
    ffn.eval(), plain.eval()
    torch.testing.assert_close(ffn(x), plain(x), rtol=0, atol=0)
    ffn.train()
    ffn.norm1.eval(), ffn.norm2.eval(), plain.train()
    plain.norm1.eval(), plain.norm2.eval()
    assert not torch.allclose(ffn(x), plain(x))  # in training they do drop


@settings(max_examples=25, deadline=None)
@given(
    C=st.integers(1, 24),
    ratio=st.sampled_from([1.0, 2.0, 4.0]),
    idle=st.floats(0.0, 1.0),
    tokens=st.integers(1, 17),
    norm=st.sampled_from(['BN', 'LN']),
)
def test_fold_property(C, ratio, idle, tokens, norm):
    ffn = make(C=C, idle=idle, norm=norm, mlp_ratio=ratio)
    x = torch.randn(2, tokens, C, dtype=torch.float64)
    ref = ffn(x)
    assert max_abs_diff(reparameterize(ffn)(x), ref) <= 1e-10


# --- MetaFormer hosts: residual scale, layer scale, no biases, StarReLU (RePaFormer §4) ---


def metaformer_ffn(C, idle, norm='BN', dtype=torch.float64, layer_scale=True, **kw):
    """An FFN with every MetaFormer option; randomize_ makes r, g, s and b non-trivial."""
    kw.setdefault('act_cfg', dict(type='StarReLU'))
    ffn = ChannelIdleFFN(
        C,
        idle_ratio=idle,
        **NORMS[norm],
        bias=False,
        res_scale=True,
        layer_scale_init=1e-5 if layer_scale else None,
        **kw,
    )
    return randomize_(ffn).to(dtype).eval()


def reference_ffn(ffn, x):
    """The training-time function written out from the parameters (independent of forward)."""
    from mmrepa.layers import channels_last_norm

    a = ffn.active_channels
    h = channels_last_norm(ffn.norm1, x) @ ffn.fc1.weight.t()
    s, b = ffn.act.scale, ffn.act.bias
    h = torch.cat([s * torch.relu(h[..., :a]) ** 2 + b, h[..., a:]], dim=-1)
    if ffn.norm2 is not None:
        h = channels_last_norm(ffn.norm2, h)
    z = (h @ ffn.fc2.weight.t()) * ffn.layer_scale
    return ffn.res_scale * x + z


@pytest.mark.parametrize('norm', ['BN', 'LN'])
@pytest.mark.parametrize('idle', [0.0, 0.3, 0.75, 1.0])
@pytest.mark.parametrize('C', [7, 13, 24])  # awkward widths: ceil(4C(1 - idle)) is not round
def test_metaformer_options_fold_exactly_in_float64(norm, idle, C):
    ffn = metaformer_ffn(C, idle, norm)
    x = torch.randn(2, 5, 9, C, dtype=torch.float64) * 2 + 0.3
    ref = ffn(x)
    assert max_abs_diff(ref, reference_ffn(ffn, x)) <= 1e-12
    folded = reparameterize(copy.deepcopy(ffn))
    assert max_abs_diff(folded(x), ref) <= 1e-10


@pytest.mark.parametrize('norm', ['BN', 'LN'])
@pytest.mark.parametrize('idle', [0.0, 0.75])
def test_metaformer_options_fold_close_in_float32(norm, idle):
    ffn = metaformer_ffn(37, idle, norm, dtype=torch.float32, layer_scale=False)
    x = torch.randn(3, 11, 37)
    ref = ffn(x)
    torch.testing.assert_close(
        reparameterize(copy.deepcopy(ffn))(x), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item()
    )


def test_folded_starrelu_ffn_uses_the_bare_activation_and_folds_the_shortcut():
    from mmrepa.backbones.metaformer import SquaredReLU

    C = 16
    ffn = reparameterize(metaformer_ffn(C, 0.75, 'BN'))
    assert type(ffn.act) is SquaredReLU and not list(ffn.act.parameters())
    assert ffn.res_scale is None  # diag(r) lives in in_proj's linear part
    assert {n for n, _ in ffn.named_parameters()} == {
        'in_proj.weight',
        'in_proj.bias',
        'out_proj.weight',
    }
    ln = reparameterize(metaformer_ffn(C, 0.75, 'LN'))  # the LN shortcut stays, scaled
    assert ln.res_scale is not None and ln.norm1 is not None


@pytest.mark.parametrize('norm', ['BN', 'LN'])
def test_metaformer_options_deploy_round_trip(norm):
    kw = dict(**NORMS[norm], act_cfg=dict(type='StarReLU'), bias=False, res_scale=True)
    ffn = randomize_(ChannelIdleFFN(12, idle_ratio=0.5, layer_scale_init=0.1, **kw))
    ffn = ffn.double().eval()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    ref = ffn(x)
    state = reparameterize(ffn).state_dict()
    fresh = ChannelIdleFFN(12, idle_ratio=0.5, layer_scale_init=0.1, deploy=True, **kw)
    fresh.double().eval().load_state_dict(state)  # strict: same structure
    assert max_abs_diff(fresh(x), ref) <= 1e-10


def test_res_and_layer_scale_train_from_their_initial_values():
    ffn = ChannelIdleFFN(8, res_scale=True, layer_scale_init=1e-5)
    assert torch.equal(ffn.res_scale, torch.ones(8))
    assert torch.equal(ffn.layer_scale, torch.full((8,), 1e-5))
    x = torch.randn(2, 3, 8)
    ffn(x).sum().backward()
    assert ffn.res_scale.grad is not None and ffn.layer_scale.grad is not None


@settings(max_examples=25, deadline=None)
@given(
    C=st.integers(1, 20),
    idle=st.floats(0.0, 1.0),
    norm=st.sampled_from(['BN', 'LN']),
    layer_scale=st.booleans(),
)
def test_metaformer_fold_property(C, idle, norm, layer_scale):
    ffn = metaformer_ffn(C, idle, norm, layer_scale=layer_scale)
    x = torch.randn(2, 3, C, dtype=torch.float64)
    ref = ffn(x)
    assert max_abs_diff(reparameterize(ffn)(x), ref) <= 1e-10
