"""StarReLU, SepConv and windowed self-attention: the MetaFormer layers, against references."""

import copy
import weakref

import pytest
import torch
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mmrepa import FoldError, reparameterize
from mmrepa.layers import SepConv, SquaredReLU, StarReLU, WindowedSelfAttention
from mmrepa.registry import build_activation_layer as mmrepa_build_activation
from tests.helpers import max_abs_diff, naive_windowed_attention, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 fold comparisons at 1e-5 ≈ 168·u32 of the output's scale (rtol 1e-5 too): a size
# factor of the reductions (7x7 depthwise, 2C pointwise) in two orders; observed ≤ 0.013 of it.


def test_star_relu_is_its_formula_with_and_without_autograd():
    # from any scope through mmcv as 'mmrepa.StarReLU'; by its plain name inside mmrepa
    act = build_activation_layer(
        dict(type='mmrepa.StarReLU', scale_value=0.8944, bias_value=-0.4472)
    )
    assert isinstance(act, StarReLU)
    assert isinstance(mmrepa_build_activation(dict(type='StarReLU')), StarReLU)
    x = torch.randn(4, 33, requires_grad=True)
    expected = 0.8944 * torch.clamp(x, min=0) ** 2 - 0.4472
    y = act(x)  # autograd path
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    assert act.scale.grad is not None and act.bias.grad is not None and x.grad is not None
    with torch.no_grad():  # in-place path, on relu's output and not on the input
        x_in = x.detach().clone()
        torch.testing.assert_close(act(x_in), expected.detach())
        assert torch.equal(x_in, x.detach())
    y = act(x.detach())  # input without grad, learnable s and b: the autograd path
    assert y.requires_grad
    torch.testing.assert_close(y, expected)


def test_star_relu_output_affine_protocol():
    act = StarReLU(scale_value=1.7, bias_value=-0.3)
    s, b = act.output_affine(torch.float64)
    bare = act.bare()
    assert isinstance(bare, SquaredReLU) and not list(bare.parameters())
    x = torch.randn(50, dtype=torch.float64)
    torch.testing.assert_close(act.double()(x), bare(x) * s + b)


def test_squared_relu_in_place_path_does_not_touch_the_input():
    x = torch.randn(10)
    keep = x.clone()
    with torch.no_grad():
        SquaredReLU(bias=True)(x)
    assert torch.equal(x, keep)


def sep_conv(dims=6, dtype=torch.float64, **kw):
    return randomize_(SepConv(dims, **kw)).to(dtype).eval()


def reference_sep_conv(m, x):
    """The published SepConv written out: NCHW convolutions, StarReLU from its formula."""
    x = x.permute(0, 3, 1, 2)
    h = F.conv2d(x, m.pwconv1.weight[:, :, None, None])
    h = m.act1.scale * torch.relu(h) ** 2 + m.act1.bias
    h = F.conv2d(h, m.dwconv.weight, padding=m.dwconv.padding, groups=m.dwconv.groups)
    return F.conv2d(h, m.pwconv2.weight[:, :, None, None]).permute(0, 2, 3, 1)


@pytest.mark.parametrize('hw', [(5, 9), (13, 4), (1, 1)])  # smaller than the 7x7 kernel too
def test_sep_conv_folds_the_star_relu_scale_exactly(hw):
    m = sep_conv()
    x = torch.randn(2, *hw, 6, dtype=torch.float64)
    ref = m(x)
    assert max_abs_diff(ref, reference_sep_conv(m, x)) <= 1e-12
    folded = reparameterize(copy.deepcopy(m))
    assert isinstance(folded.act1, SquaredReLU) and not hasattr(folded.act1, 'scale')
    assert max_abs_diff(folded(x), ref) <= 1e-10
    fresh = SepConv(6, deploy=True).double().eval()
    fresh.load_state_dict(folded.state_dict())
    assert max_abs_diff(fresh(x), ref) <= 1e-10


def test_sep_conv_fold_is_close_in_float32_and_keeps_a_conv_bias():
    m = sep_conv(dims=20, dtype=torch.float32, bias=True)
    x = torch.randn(1, 23, 17, 20)
    ref = m(x)
    torch.testing.assert_close(
        reparameterize(copy.deepcopy(m))(x), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item()
    )


def test_sep_conv_with_a_zero_star_relu_scale_refuses_to_fold():
    m = sep_conv()
    with torch.no_grad():
        m.act1.scale.zero_()
    with pytest.raises(FoldError, match='scale .* is exactly 0'):
        reparameterize(m)


def test_sep_conv_without_an_affine_activation_is_already_folded():
    m = SepConv(4, act_cfg=dict(type='GELU')).eval()
    state = copy.deepcopy(m.state_dict())
    reparameterize(m)
    assert m.deploy and all(torch.equal(v, state[k]) for k, v in m.state_dict().items())


@pytest.mark.parametrize(
    'window, hw', [(None, (5, 7)), (3, (5, 7)), (3, (6, 9)), (4, (3, 11)), (7, (7, 7)), (7, (3, 5))]
)
def test_windowed_attention_matches_a_naive_window_loop(window, hw):
    attn = randomize_(WindowedSelfAttention(24, head_dim=8, window_size=window)).double()
    x = torch.randn(2, *hw, 24, dtype=torch.float64)
    with torch.no_grad():
        assert max_abs_diff(attn(x), naive_windowed_attention(attn, x, window)) <= 1e-12


def test_a_window_covering_the_map_is_global_attention():
    glob = randomize_(WindowedSelfAttention(16, head_dim=8)).double()
    win = copy.deepcopy(glob)
    win.window_size = 4
    x = torch.randn(1, 4, 4, 16, dtype=torch.float64)
    with torch.no_grad():
        assert max_abs_diff(win(x), glob(x)) <= 1e-12
        x = torch.randn(1, 5, 4, 16, dtype=torch.float64)  # now two windows: not global
        assert max_abs_diff(win(x), glob(x)) > 1e-3


def test_attention_heads_follow_timm():
    assert WindowedSelfAttention(320).num_heads == 10  # head_dim 32
    assert WindowedSelfAttention(576).num_heads == 18
    assert WindowedSelfAttention(20, head_dim=32).num_heads == 1
    assert WindowedSelfAttention(384).qkv.bias is None


@pytest.mark.parametrize('window', [0, 2.5, True])
def test_bad_window_size_says_what_is_allowed(window):
    with pytest.raises(ValueError, match='window_size must be an integer >= 1 or None'):
        WindowedSelfAttention(16, window_size=window)


class PeakMemory(TorchDispatchMode):
    """Peak bytes of live tensors created under this mode (views and in-place ops excluded)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    nbytes = t.untyped_storage().nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t.untyped_storage(), self._free, nbytes)
        return out

    def _free(self, nbytes):
        self.live -= nbytes


def attention_peak_mib(window, hw, dims=384):
    """Peak memory of one CAFormer-M36 stage-3 attention layer on a (1, H, W, 384) map.

    On the meta device (shapes only, nothing allocated) and with the math backend, which
    materialises the attention matrix as the reference implementation does.
    """
    with torch.device('meta'):
        attn = WindowedSelfAttention(dims, window_size=window)
        x = torch.empty(1, *hw, dims)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), PeakMemory() as mem:
        attn(x)
    return mem.peak / 2**20


def test_windowed_attention_memory_stays_bounded_at_800x1333():
    stage3 = (50, 84)  # the stride-16 map of an 800 x 1333 image
    global_mib = attention_peak_mib(None, stage3)
    windowed_mib = attention_peak_mib(14, stage3)
    # global: 12 heads x 4200^2 fp32 scores = 807 MiB per (4200 x 4200) matrix stack, and the
    # math backend holds about three at once; windowed: 24 windows x 12 heads x 196^2 = 42 MiB
    assert global_mib > 2000
    assert windowed_mib < 256
    # doubling the image area doubles windowed memory (linear), but quadruples global
    larger = (100, 84)
    assert attention_peak_mib(14, larger) < 2.1 * windowed_mib
    assert attention_peak_mib(None, larger) > 3.9 * global_mib
