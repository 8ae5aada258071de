"""The one position-embedding resize (mmrepa/layers/pos_embed.py) that the plain ViTs and
PRepBN-PVT share."""

import pytest
import torch
import torch.nn.functional as F

from mmrepa.layers.pos_embed import resize_pos_embed

DT = torch.float64


def _grid_resized(grid: torch.Tensor, src, dst, mode: str) -> torch.Tensor:
    """(1, Hs·Ws, C) -> (1, Hd·Wd, C) written out: tokens row by row, channels last."""
    image = grid.reshape(1, *src, -1).permute(0, 3, 1, 2)
    out = F.interpolate(image, size=dst, mode=mode, align_corners=False)
    return out.permute(0, 2, 3, 1).reshape(1, dst[0] * dst[1], -1)


def test_the_pretraining_grid_is_returned_as_it_is():
    pos = torch.randn(1, 1 + 12, 8, dtype=DT)
    assert resize_pos_embed(pos, (3, 4), (3, 4), num_extra_tokens=1) is pos


@pytest.mark.parametrize('mode', ['bilinear', 'bicubic'])
@pytest.mark.parametrize('extra', [0, 1])
def test_the_grid_is_resized_row_by_row_and_the_class_token_kept_in_front(mode, extra):
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(1, extra + 3 * 4, 8, generator=g, dtype=DT)
    out = resize_pos_embed(pos, (3, 4), (5, 7), mode=mode, num_extra_tokens=extra)
    assert out.shape == (1, extra + 35, 8) and out.dtype == DT  # not cut to float32
    assert torch.equal(out[:, :extra], pos[:, :extra])
    assert torch.equal(out[:, extra:], _grid_resized(pos[:, extra:], (3, 4), (5, 7), mode))
