"""MixToken (LV-ViT): the box as LV-ViT's release draws it, the backbone's mixed forward against
CutMix on the image written out (a patch-aligned box mixes tokens exactly as it mixes the
patches' pixels), eval mode and the fold left alone, one-line refusals."""

import pytest
import torch

from mmrepa import reparameterize
from mmrepa.backbones import RePaViT
from mmrepa.errors import ConfigError
from mmrepa.layers import MixedTokens, draw_token_box

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.

P = 8  # patch size
ARCH = dict(embed_dims=16, num_layers=2, num_heads=2)
# LV-ViT's residual scaling and BatchNorm FFN, with the one-conv patch embedding: each token
# sees its own patch's pixels only
KW = dict(skip_lam=2.0, qkv_bias=False, patch_size=P, img_size=(32, 40), drop_path_rate=0.0)


def _model(**kw):
    torch.manual_seed(0)
    return RePaViT(ARCH, out_type='raw', out_indices=(0, 1), **KW, **kw).double()


def _release_box(h, w, lam, cy, cx):
    """LV-ViT's rand_bbox, written out for rows h and columns w."""
    cut_h, cut_w = int(h * (1 - lam) ** 0.5), int(w * (1 - lam) ** 0.5)
    clip = lambda v, n: min(max(v, 0), n)  # noqa: E731
    return (
        clip(cy - cut_h // 2, h),
        clip(cy + cut_h // 2, h),
        clip(cx - cut_w // 2, w),
        clip(cx + cut_w // 2, w),
    )


def test_the_box_is_lvvits_and_follows_the_seed():
    """From the same draws (lam ~ Beta(1, 1), then the centre's row and column), the box is
    the release's; the area gives lam; the same seed gives the same box."""
    boxes = []
    for seed in range(100):
        torch.manual_seed(seed)
        box = draw_token_box((7, 9), 1.0)
        torch.manual_seed(seed)
        lam = float(torch.distributions.Beta(1.0, 1.0).sample())
        cy, cx = int(torch.randint(7, ())), int(torch.randint(9, ()))
        assert tuple(box[:4]) == _release_box(7, 9, lam, cy, cx) and box.grid == (7, 9)
        area = (box.bottom - box.top) * (box.right - box.left)
        assert box.lam == 1 - area / 63
        boxes.append(box)
    assert len(set(boxes)) > 50
    assert max(b.lam for b in boxes) == 1.0 and min(b.lam for b in boxes) < 0.5


def _pixel_cutmix(x, box):
    """CutMix written out on the image: the box's patches' pixels from the batch flipped."""
    mixed = x.clone()
    B = x.shape[0]
    for i in range(B):
        for r in range(box.top, box.bottom):
            for c in range(box.left, box.right):
                rows, cols = slice(r * P, (r + 1) * P), slice(c * P, (c + 1) * P)
                mixed[i, :, rows, cols] = x[B - 1 - i, :, rows, cols]
    return mixed


def _put_back(tokens, box, grid_w):
    """Each patch token inside the box back in the image its patch came from."""
    out = tokens.clone()
    B = tokens.shape[0]
    for i in range(B):
        for r in range(box.top, box.bottom):
            for c in range(box.left, box.right):
                out[i, 1 + r * grid_w + c] = tokens[B - 1 - i, 1 + r * grid_w + c]
    return out


def test_mixed_forward_equals_cutmix_on_the_patches_with_tokens_put_back():
    """Training forward with mix_token on a 3-image batch (odd: the middle image keeps its
    tokens) equals the plain model on the image CutMixed patch-wise, with the box's patch tokens
    returned to their images; the class token stays the mixed image's. float64, train mode (its
    BatchNorms see the same tokens either way)."""
    mixing, plain = _model(mix_token=True).train(), _model().train()
    plain.load_state_dict(mixing.state_dict())
    x = torch.randn(3, 3, 5 * P, 6 * P, dtype=torch.float64)  # a 5 x 6 grid, not the 4 x 5 one
    for seed in range(100):  # a box neither empty nor the whole grid
        torch.manual_seed(seed)
        box = draw_token_box((5, 6), 1.0)
        if 0 < box.lam < 1:
            break
    torch.manual_seed(seed)
    outs = mixing(x)
    assert isinstance(outs, MixedTokens) and outs.box == box
    expected = plain(_pixel_cutmix(x, box))
    for out, ref in zip(outs, expected):
        torch.testing.assert_close(out, _put_back(ref, box, 6), rtol=1e-12, atol=1e-12)
    # mixing changed the class token (the check above can fail)
    assert not torch.allclose(outs[-1][:, 0], plain(x)[-1][:, 0])


def test_eval_mode_and_the_folded_model_ignore_mix_token():
    mixing, plain = _model(mix_token=True), _model()
    plain.load_state_dict(mixing.state_dict())
    mixing.train()
    mixing(torch.randn(4, 3, 32, 40, dtype=torch.float64))  # BatchNorm statistics
    plain.load_state_dict(mixing.state_dict())
    mixing.eval()
    plain.eval()
    x = torch.randn(2, 3, 32, 40, dtype=torch.float64)
    outs = mixing(x)
    assert type(outs) is tuple
    for a, b in zip(outs, plain(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    reparameterize(mixing)
    for a, b in zip(mixing(x), plain(x)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    deployed = _model(mix_token=True, deploy=True).eval()
    deployed.load_state_dict(mixing.state_dict())
    assert type(deployed(x)) is tuple


@pytest.mark.parametrize(
    'kw, words',
    [
        (dict(out_type='cls'), "out_type='raw'"),
        (dict(out_type='raw', with_cls_token=False), 'with_cls_token=True'),
        (dict(out_type='raw', mix_token_beta=0.0), 'mix_token_beta must be > 0'),
    ],
)
def test_what_mix_token_cannot_combine_with_is_refused_in_one_line(kw, words):
    with pytest.raises(ConfigError, match=words) as e:
        RePaViT(ARCH, mix_token=True, **KW, **kw)
    assert '\n' not in str(e.value)
