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

# relative to the largest output: float64 exact up to rounding, float32 close
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
dtypes = st.sampled_from([torch.float64, torch.float32])
idle_ratios = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))
sizes = st.tuples(st.integers(17, 70), st.integers(17, 70))


def assert_fold_exact(model, size, dtype, seed):
    model = randomize_(model, seed).to(dtype).eval()
    x = torch.randn(1, 3, *size, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = model(x)
        out = reparameterize(copy.deepcopy(model))(x)
        if dtype == torch.float64:
            exact, rounding = ref, 0.0
        else:
            # in float32 each form rounds by itself: a tiny model (2 channels, linear attention)
            # far more than 1e-4, and the folded form more where a fold makes large biases that
            # cancel (BatchNorm means through an all-linear FFN: ~25 against outputs of ~1).
            # Bound: both forms' own errors against float64, the folded form's taken as the
            # float64 fold rounded once to float32 (what a float32 fold must give)
            exact = copy.deepcopy(model).double()(x.double())
            rounded = reparameterize(copy.deepcopy(model).double()).float()(x)
            rounding = _max_err(rounded, exact) + _max_err(ref, exact)
    scale = max(r.abs().max().item() for r in ref)
    err = _max_err(out, ref)
    assert err <= max(TOLERANCE[dtype] * scale, 2 * rounding), (err, rounding, scale)


def _max_err(outs, refs) -> float:
    return max((o.double() - r.double()).abs().max().item() for o, r in zip(outs, refs))


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
