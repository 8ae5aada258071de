"""Property tests: every fold of every backbone, over random widths, idle ratios, windows,
input sizes and dtypes. Each example folds a whole small backbone, so patch embedding, patch
merging, block norms into qkv (with window padding), the FFN and MetaFormer's MLP all take part.
"""

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, ConvFormer, PRepBNSwin, RePaSwin
from tests.helpers import randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.

dtypes = st.sampled_from([torch.float64, torch.float32])
idle_ratios = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))
sizes = st.tuples(st.integers(17, 70), st.integers(17, 70))


def assert_fold_exact(model, size, dtype, seed):
    """The folded model's outputs equal the model's to 1e-10 of the largest, in float64 on the
    example's weights; in float32, besides, the fold's weights are the float64 fold's rounded
    once. Float32 outputs are not compared: each form rounds by itself, the folded one far
    more where a fold makes large terms that cancel (BatchNorm means through an all-linear FFN
    gave biases of ~25 against outputs of ~1 and 16x the unfolded form's float32 error)."""
    model = randomize_(model, seed).to(dtype).eval()
    wide = copy.deepcopy(model).double()
    x = torch.randn(1, 3, *size, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = wide(x)
        folded_wide = reparameterize(copy.deepcopy(wide))
        out = folded_wide(x)
    scale = max(r.abs().max().item() for r in ref)
    err = max((r - o).abs().max().item() for r, o in zip(ref, out))
    assert err <= 1e-10 * scale, (err, scale)
    if dtype != torch.float64:
        got = reparameterize(copy.deepcopy(model)).state_dict()
        expected = folded_wide.state_dict()
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            value = value.to(dtype) if value.is_floating_point() else value
            assert torch.equal(got[key], value), key


@settings(max_examples=12, deadline=None)
@given(
    heads=st.integers(1, 2),
    head_dim=st.integers(2, 6),
    idle=idle_ratios,
    window=st.integers(2, 5),
    size=sizes,
    dtype=dtypes,
    prepbn=st.booleans(),
    linear_attention=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_swin_backbones_fold_exactly(
    heads, head_dim, idle, window, size, dtype, prepbn, linear_attention, seed
):
    arch = dict(embed_dims=heads * head_dim, depths=(2, 1, 2, 1), num_heads=(heads,) * 4)
    if prepbn:
        model = PRepBNSwin(
            arch=arch,
            window_size=window,
            idle_ratio=idle,
            attn_types='LSSS' if linear_attention else 'SSSS',
            linear_window_sizes=window + 1,
        )
    else:
        model = RePaSwin(arch=arch, window_size=window, idle_ratio=idle)
    assert_fold_exact(model, size, dtype, seed)


@settings(max_examples=12, deadline=None)
@given(
    dims=st.tuples(*(st.sampled_from([8, 16]) for _ in range(4))),
    idle=idle_ratios,
    window=st.one_of(st.none(), st.integers(1, 4)),
    size=sizes,
    dtype=dtypes,
    attention=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_metaformer_backbones_fold_exactly(dims, idle, window, size, dtype, attention, seed):
    arch = dict(depths=(1, 1, 1, 1), dims=dims)
    if attention:
        model = CAFormer(
            arch=arch, head_dim=8, idle_ratio=idle, window_size=(None, None, window, window)
        )
    else:
        model = ConvFormer(arch=arch, idle_ratio=idle)
    assert_fold_exact(model, size, dtype, seed)
