"""The one position-embedding resize (mmrepa/layers/pos_embed.py) that the plain ViTs and
PRepBN-PVT share."""

import pytest
import torch

from mmrepa.layers.pos_embed import resize_pos_embed

DT = torch.float64
# the reference: mmpretrain's resize, which rounds the grid to float32 and resizes in float32.
# Each output is a sum of at most 16 weighted inputs (bicubic, 4x4 taps) whose weights' absolute
# values sum to at most ~1.6, so it differs from the float64 resize by at most about
# (1 rounding + 16 accumulations + the weights' rounding) · u32 · 1.6 · max|x| with
# u32 = 2^-24 ≈ 6e-8: below 64 · u32 · max|x| ≈ 3.8e-6 · max|x|. A wrong order of the tokens or
# another alignment moves outputs by O(max|x|); observed ≤ 7.4 · u32 · max|x|.
ROUNDOFF = 64 * 2.0**-24


def test_the_pretraining_grid_is_returned_as_it_is():
    pos = torch.randn(1, 1 + 12, 8, dtype=DT)
    assert resize_pos_embed(pos, (3, 4), (3, 4), num_extra_tokens=1) is pos


@pytest.mark.parametrize('mode', ['bilinear', 'bicubic'])
@pytest.mark.parametrize('extra', [0, 1])
def test_the_grid_is_resized_row_by_row_and_the_class_token_kept_in_front(mode, extra):
    mmpretrain_utils = pytest.importorskip('mmpretrain.models.utils')
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(1, extra + 3 * 4, 8, generator=g, dtype=DT)
    out = resize_pos_embed(pos, (3, 4), (5, 7), mode=mode, num_extra_tokens=extra)
    assert out.shape == (1, extra + 35, 8) and out.dtype == DT  # not cut to float32
    assert torch.equal(out[:, :extra], pos[:, :extra])
    ref = mmpretrain_utils.resize_pos_embed(pos, (3, 4), (5, 7), mode=mode, num_extra_tokens=extra)
    tol = ROUNDOFF * pos.abs().max().item()
    assert torch.allclose(out, ref, rtol=0, atol=tol), (out - ref).abs().max()
