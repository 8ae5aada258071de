"""StarReLU and SepConv: MetaFormer's own layers, against references."""

import copy

import pytest
import torch
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer

from mmrepa import FoldError, reparameterize
from mmrepa.backbones.metaformer import SepConv, SquaredReLU, StarReLU
from mmrepa.registry import build_activation_layer as mmrepa_build_activation
from tests.helpers import max_abs_diff, randomize_

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
