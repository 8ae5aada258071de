"""RePaSwin with ``shift_small_maps=False`` computes the released Swin (Microsoft's, timm's).

timm's models get random weights and are copied in through RePaSwin's own converter, from
timm's layout and from the Microsoft release's; float64, so any difference is a real one.
"""

import copy
import glob
import os.path as osp
import re

import pytest
import torch

from mmrepa import reparameterize
from mmrepa.backbones import PRepBNSwin, RePaSwin
from tests.helpers import ROOT, TINY_ARCH, max_abs_diff, max_relative, randomize_

timm = pytest.importorskip('timm')

# Swin-T as released, and Swin-S/B shapes with fewer blocks (stage 4 keeps a shifted block)
SHAPES = {
    'tiny': dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    'small-shaped': dict(embed_dim=96, depths=(1, 1, 2, 2), num_heads=(3, 6, 12, 24)),
    'base-shaped': dict(embed_dim=128, depths=(1, 1, 2, 2), num_heads=(4, 8, 16, 32)),
}
SMALL = dict(embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def timm_swin(img_size=224, window_size=7, **shape):
    torch.manual_seed(0)
    ref = timm.create_model(
        'swin_tiny_patch4_window7_224',
        pretrained=False,
        drop_path_rate=0.0,
        img_size=img_size,
        window_size=window_size,
        **shape,
    )
    return perturb_(ref).double().eval()


def perturb_(model, seed=0):
    """timm's random init (seeded) with every parameter moved by noise: norms and biases are
    not all ones and zeros, yet the network stays as well-conditioned as a trained Swin (with
    weights of one scale throughout the shift of stage 4 drowns in the residual stream)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def timm_to_release(state_dict):
    """timm's layout -> the Microsoft release's: patch merging at the end of its own stage,
    the classifier called ``head``."""
    out = {}
    for k, v in state_dict.items():
        m = re.match(r'layers\.(\d+)\.downsample\.(.*)', k)
        if m:
            k = f'layers.{int(m.group(1)) - 1}.downsample.{m.group(2)}'
        out[k.replace('head.fc.', 'head.')] = v
    return out


def ours_from(tmp_path, state_dict, shape, cls=RePaSwin, **kw):
    """Our model loading ``state_dict`` through ``init_cfg``, as a config does."""
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': state_dict}, path)
    arch = dict(embed_dims=shape['embed_dim'], depths=shape['depths'], num_heads=shape['num_heads'])
    if cls is RePaSwin:
        kw = dict(idle_ratio=0.0, ffn_norm='LN', **kw)
    model = cls(
        arch=arch,
        drop_path_rate=0.0,
        out_indices=(3,),
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
        **kw,
    )
    model.init_weights()
    return model.double().eval()


def assert_equal_to_timm(ours, ref, x):
    """The normed last stage, and the logits of timm's head on it (timm's forward is
    ``forward_head(forward_features(x))``)."""
    with torch.no_grad():
        expected = ref.forward_features(x)  # NHWC
        (features,) = ours(x)
        features = features.permute(0, 2, 3, 1)
        # u64 = 2^-53 ≈ 1.1e-16 × reductions of ≤ 3072 terms (≈ 3e-13 a layer on values ≲ 10)
        # × ~10^2 layers ≈ 1e-10, features and logits alike; observed ≤ 2e-14
        assert max_abs_diff(features, expected) <= 1e-10
        assert max_relative(ref.forward_head(features), ref.forward_head(expected)) <= 1e-10


@pytest.mark.parametrize('name', list(SHAPES))
def test_released_swin_at_224_from_the_microsoft_layout(tmp_path, name):
    shape = SHAPES[name]
    ref = timm_swin(**shape)
    ours = ours_from(tmp_path, timm_to_release(ref.state_dict()), shape, shift_small_maps=False)
    assert_equal_to_timm(ours, ref, torch.randn(1, 3, 224, 224, dtype=torch.float64))


def test_timm_layout_loads_and_equals_timm(tmp_path):
    ref = timm_swin(**SMALL)
    ours = ours_from(tmp_path, ref.state_dict(), SMALL, shift_small_maps=False)
    assert_equal_to_timm(ours, ref, torch.randn(1, 3, 224, 224, dtype=torch.float64))


def test_timm_layout_equals_the_microsoft_layout(tmp_path):
    ref = timm_swin(**SMALL)
    a = ours_from(tmp_path, ref.state_dict(), SMALL).state_dict()
    b = ours_from(tmp_path, timm_to_release(ref.state_dict()), SMALL).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_prepbn_swin_from_a_layernorm_release_is_the_released_swin(tmp_path):
    """λ = 1 (train mode, no dropout or drop path): PRepBN-Swin is the LayerNorm Swin."""
    ref = timm_swin(**SMALL)
    ours = ours_from(tmp_path, ref.state_dict(), SMALL, cls=PRepBNSwin, shift_small_maps=False)
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        (features,) = ours.train()(x)
        assert max_abs_diff(features, ref.forward_features(x).permute(0, 3, 1, 2)) <= 1e-10


def test_a_map_smaller_than_the_window_attends_in_one_clamped_window(tmp_path):
    """Window 14 at 224: stage 3 (14x14) has no shift, stage 4 (7x7) one 7x7 window. timm
    builds that stage with a 13x13 bias table; ours keeps the 27x27 one of window 14 and reads
    the same relative offsets from its centre."""
    ref = timm_swin(window_size=14, **SMALL)
    state = ref.state_dict()
    ours = ours_from(
        tmp_path, timm_to_release(state), SMALL, window_size=14, shift_small_maps=False
    )
    with torch.no_grad():
        for j, block in enumerate(ours.stages[3].blocks):
            table = block.attn.w_msa.relative_position_bias_table.view(27, 27, -1)
            small = state[f'layers.3.blocks.{j}.attn.relative_position_bias_table']
            table[7:20, 7:20] = small.view(13, 13, -1)
    assert_equal_to_timm(ours, ref, torch.randn(1, 3, 224, 224, dtype=torch.float64))


def test_mmdet_behaviour_is_the_default_and_differs_from_the_release_at_224(tmp_path):
    ref = timm_swin(**SMALL)
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    mmdet_like = ours_from(tmp_path, ref.state_dict(), SMALL)
    assert mmdet_like.stages[3].blocks[1].attn.shift_small_maps
    with torch.no_grad():
        (features,) = mmdet_like(x)
        assert max_abs_diff(features, ref.forward_features(x).permute(0, 3, 1, 2)) > 1e-3


@pytest.mark.parametrize('hw', [(256, 256), (75, 101)])
def test_both_behaviours_agree_where_every_map_is_larger_than_the_window(tmp_path, hw):
    """At 256 px the last map is 8x8; at 75x101 it is 3x4 and the choice matters (checked
    to differ)."""
    ref = timm_swin(**SMALL)
    x = torch.randn(1, 3, *hw, dtype=torch.float64)
    with torch.no_grad():
        a = ours_from(tmp_path, ref.state_dict(), SMALL)(x)
        b = ours_from(tmp_path, ref.state_dict(), SMALL, shift_small_maps=False)(x)
    # the same windows and shifts at 256 px, so the same arithmetic (observed 0); 1e-12 ≈ 10^4·u64
    assert (max_abs_diff(a, b) <= 1e-12) == (hw == (256, 256))


@pytest.mark.parametrize('cls', [RePaSwin, PRepBNSwin])
def test_fold_is_exact_on_clamped_and_padded_windows(cls):
    """At 75x101 the maps are 19x26, 10x13, 5x7, 3x4: with linear windows (20, 6) stage 1's
    linear attention runs on one clamped 19x19 window (its positional encoding resized) and
    stages 3-4 on clamped 5x5 and 3x3 windows, the longer side padded (where a folded norm's
    padded tokens keep the pre-fold qkv)."""
    kw = dict(idle_ratio=0.75) if cls is RePaSwin else {}
    model = cls(
        arch=TINY_ARCH,
        attn_types='LLSS',
        linear_window_sizes=(20, 6, 5, 3),
        drop_path_rate=0.0,
        shift_small_maps=False,
        **kw,
    )
    model = randomize_(model).double().eval()
    assert model.stages[0].blocks[1].attn.window_and_shift((19, 26)) == (19, 0)
    assert model.stages[2].blocks[1].attn.window_and_shift((5, 7)) == (5, 0)
    x = torch.randn(2, 3, 75, 101, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        folded = reparameterize(copy.deepcopy(model))
        # u64 × ≤ 10^3-term reductions ≈ 1e-13 a layer (values ≲ 10) × ~10^2 layers; observed 1e-14
        assert max_abs_diff(folded(x), ref) <= 1e-10


def test_imagenet_configs_compute_the_released_swin_and_detection_keeps_mmdet_s():
    from mmengine.config import Config

    for path in glob.glob(osp.join(ROOT, 'configs', '*_swin', '*_in1k.py')):
        assert Config.fromfile(path).model.backbone.shift_small_maps is False, path
    # detection and segmentation (parsing them all takes seconds): the default, mmdet's Swin
    others = glob.glob(osp.join(ROOT, 'configs', '*_swin', '*.py'))
    others += glob.glob(osp.join(ROOT, 'configs', '_base_', 'models', '*_swin.py'))
    for path in others:
        if not path.endswith('_in1k.py'):
            with open(path) as f:
                assert 'shift_small_maps' not in f.read(), path


@pytest.mark.parametrize('shift_small_maps', [True, False])
def test_mmdet_parity_at_detection_sizes_holds_either_way(tmp_path, shift_small_maps):
    """At 256² and 800x1333 every map is larger than the window: both settings are mmdet's
    Swin."""
    from mmdet.models.backbones import SwinTransformer

    ref = SwinTransformer(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))
    ref = randomize_(ref).double()
    ref.eval()  # mmdet's Swin.train() returns None
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': ref.state_dict()}, path)
    ours = RePaSwin(
        arch=TINY_ARCH,
        idle_ratio=0.0,
        ffn_norm='LN',
        drop_path_rate=0.0,
        shift_small_maps=shift_small_maps,
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
    )
    ours.init_weights()
    ours = ours.double().eval()
    for hw in [(256, 256), (800, 1333)]:
        x = torch.randn(1, 3, *hw, dtype=torch.float64)
        with torch.no_grad():
            assert max_abs_diff(ours(x), ref(x)) <= 1e-10, hw
