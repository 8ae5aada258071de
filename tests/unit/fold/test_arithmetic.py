"""The shared fold arithmetic (mmrepa/fold/arithmetic.py) against the layers it stands for, in
float64: each formula's output equals the unfolded computation to 1e-12 (one layer of order-1
values; a missing term moves it by order 1)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmrepa.fold.arithmetic import affine_after_conv, affine_into_conv, batchnorm_affine

DT = torch.float64


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=DT)


def _batchnorm(channels: int, g: torch.Generator) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels).to(DT).eval()
    with torch.no_grad():
        for t in (bn.weight, bn.bias, bn.running_mean):
            t.copy_(_randn(g, channels))
        bn.running_var.copy_(torch.rand(channels, generator=g, dtype=DT) + 0.5)
    return bn


@pytest.mark.parametrize('bias', [True, False])
def test_affine_into_conv_is_the_conv_of_the_affine_input(bias):
    """A norm before a conv without padding (PVT's spatial reduction): every tap reads a real,
    normalised input."""
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(4, 6, 2, stride=2, bias=bias).to(DT)
    scale, shift = _randn(g, 4), _randn(g, 4)
    x = _randn(g, 2, 4, 6, 10)
    w, b = affine_into_conv(conv, scale, shift, DT)
    with torch.no_grad():
        ref = conv(x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1))
    assert (F.conv2d(x, w, b, stride=2) - ref).abs().max() <= 1e-12


@pytest.mark.parametrize('form', ['conv with bias', 'conv without bias', 'bare kernel'])
def test_affine_after_conv_folds_a_batchnorm_after_the_conv(form):
    """A conv, or a bare kernel standing for a conv without bias (a block's summed branch
    kernels), followed by an eval-mode BatchNorm."""
    g = torch.Generator().manual_seed(1)
    conv = nn.Conv2d(4, 6, 3, padding=1, bias=form == 'conv with bias').to(DT)
    bn = _batchnorm(6, g)
    x = _randn(g, 2, 4, 7, 9)
    layer = conv.weight.detach().float() if form == 'bare kernel' else conv
    w, b = affine_after_conv(layer, *batchnorm_affine(bn, DT), DT)
    assert w.dtype == b.dtype == DT
    with torch.no_grad():
        kernel = conv.weight.float().to(DT) if form == 'bare kernel' else conv.weight
        ref = bn(F.conv2d(x, kernel, conv.bias, padding=1))
    assert (F.conv2d(x, w, b, padding=1) - ref).abs().max() <= 1e-12
