"""What every mmrepa backbone promises, checked on each family: gradient checkpointing changes
neither gradients nor BatchNorm statistics, folding keeps frozen stages frozen, refuses training
mode and adds no parameter that is zero by construction."""

import copy

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import FoldError, fold_model, reparameterize
from mmrepa.backbones import (
    CAFormer,
    ConvFormer,
    DepthRepViT,
    MLPMixer,
    PoolFormer,
    PRepBNPVT,
    PRepBNSwin,
    PRepBNViT,
    RandFormer,
    RePaSwin,
    RePaViT,
)
from mmrepa.backbones.swin import ShiftWindowMSA, shifted_window_mask
from tests.helpers import TINY_ARCH, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.

META = dict(depths=(1, 1, 2, 1), dims=(16, 32, 48, 64))
MIXER = dict(embed_dims=16, num_layers=3, tokens_mlp_dims=8, channels_mlp_dims=40, patch_size=8)
BACKBONES = {
    'repa_swin': lambda **kw: RePaSwin(TINY_ARCH, window_size=3, **kw),
    'repa_swin_bn_norms': lambda **kw: RePaSwin(
        TINY_ARCH, window_size=3, norm_cfg=dict(type='BN1d'), **kw
    ),
    'swin_ln': lambda **kw: RePaSwin(TINY_ARCH, window_size=3, idle_ratio=0, ffn_norm='LN', **kw),
    'prepbn_swin': lambda **kw: PRepBNSwin(TINY_ARCH, window_size=3, idle_ratio=0.5, **kw),
    'slab_swin': lambda **kw: PRepBNSwin(
        TINY_ARCH, window_size=3, attn_types='LLSS', linear_window_sizes=4, **kw
    ),
    'prepbn_pvt': lambda **kw: PRepBNPVT(
        dict(embed_dims=8, num_layers=(1, 2, 1, 1), num_heads=(1, 2, 2, 4)),
        pretrain_img_size=64,
        **kw,
    ),
    # SLAB-PVT: linear attention in every stage, its positional encodings sized for 64 px
    'slab_pvt': lambda **kw: PRepBNPVT(
        dict(embed_dims=8, num_layers=(1, 2, 1, 1), num_heads=(1, 2, 2, 4)),
        pretrain_img_size=64,
        attn_types='LLLL',
        **kw,
    ),
    'convformer': lambda **kw: ConvFormer(META, **kw),
    'repa_convformer': lambda **kw: ConvFormer(META, idle_ratio=0.5, **kw),
    'caformer': lambda **kw: CAFormer(META, head_dim=16, window_size=(None, None, 2, 2), **kw),
    'repa_caformer': lambda **kw: CAFormer(
        META, head_dim=16, idle_ratio=0.75, window_size=(None, None, 2, 2), **kw
    ),
    'repa_poolformer': lambda **kw: PoolFormer(META, idle_ratio=0.75, **kw),
    # identity mapping in stages 1-2, random mixing over IMAGE's token grids in stages 3-4
    'repa_randformer': lambda **kw: RandFormer(META, img_size=(45, 61), idle_ratio=0.5, **kw),
    # λ = 1: the joining finished, so that it folds
    'depth_rep_vit': lambda **kw: DepthRepViT(
        dict(embed_dims=16, num_layers=6, num_heads=2),
        num_branches=2,
        img_size=32,
        with_cls_token=False,
        out_type='featmap',
        window_size=2,
        global_blocks=(1,),
        out_indices=(0, 2),
        join_lambda=1.0,
        **kw,
    ),
    # a fixed input size: IMAGE's (6 x 8 patches, the last ones padded)
    'mlp_mixer': lambda **kw: MLPMixer(
        MIXER, img_size=IMAGE[2:], idle_ratio=0, ffn_norm='LN', **kw
    ),
    'repa_mlp_mixer': lambda **kw: MLPMixer(MIXER, img_size=IMAGE[2:], idle_ratio=0.7, **kw),
}
# ViTDet-style: windows of 2 tokens on the 3 x 4 grid, one global block
VIT_DENSE = dict(
    arch=dict(embed_dims=16, num_layers=3, num_heads=2),
    img_size=32,
    with_cls_token=False,
    out_type='featmap',
    window_size=2,
    global_blocks=(1,),
    out_indices=(0, 2),
)
BACKBONES['repa_vit'] = lambda **kw: RePaViT(**VIT_DENSE, **kw)
# RePa-LV-ViT: the BatchNorm conv stem, skip_lam, every token out (the token-labelling head's)
BACKBONES['repa_lvvit'] = lambda **kw: RePaViT(
    dict(embed_dims=16, num_layers=3, num_heads=2),
    img_size=32,
    idle_ratio=2 / 3,
    mlp_ratio=3,
    skip_lam=2.0,
    conv_stem=True,
    stem_channels=8,
    qkv_bias=False,
    out_type='raw',
    **kw,
)
BACKBONES['prepbn_vit'] = lambda **kw: PRepBNViT(**VIT_DENSE, idle_ratio=0.5, **kw)
IMAGE = (2, 3, 45, 61)  # no side a multiple of a window or of 32


def _statistics(model):
    return {
        name: torch.cat([m.running_mean, m.running_var, m.num_batches_tracked.double().view(1)])
        for name, m in model.named_modules()
        if isinstance(m, _BatchNorm)
    }


@pytest.mark.parametrize('name', BACKBONES)
def test_with_cp_changes_neither_gradients_nor_batchnorm_statistics(name):
    torch.manual_seed(0)
    plain = BACKBONES[name](drop_path_rate=0.0).train()
    checkpointed = BACKBONES[name](drop_path_rate=0.0, with_cp=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(IMAGE)
    for model in (plain, checkpointed):
        image = x.clone().requires_grad_()  # checkpointing needs an input that wants grad
        sum((o * o).mean() for o in model(image)).backward()
    stats, stats_cp = _statistics(plain), _statistics(checkpointed)
    if name not in ('swin_ln', 'caformer', 'convformer', 'depth_rep_vit', 'mlp_mixer'):
        assert stats, 'this backbone should have BatchNorms'
    for key in stats:
        assert torch.equal(stats[key], stats_cp[key]), f'{key} differs with with_cp=True'
    for (key, p), p_cp in zip(plain.named_parameters(), checkpointed.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p_cp.grad, p.grad, rtol=1e-5, atol=1e-6, msg=key)


def _trainable(model, prefixes):
    return [k for k, p in model.named_parameters() if p.requires_grad and k.startswith(prefixes)]


@pytest.mark.parametrize(
    'name',
    [
        'repa_swin',
        'prepbn_swin',
        'prepbn_pvt',
        'repa_caformer',
        'convformer',
        'depth_rep_vit',
        'repa_vit',
        'repa_lvvit',
        'repa_mlp_mixer',
        'repa_poolformer',
    ],
)
@pytest.mark.parametrize('frozen_stages', [0, 1, 2])
@pytest.mark.parametrize('how', ['switch_to_deploy', 'fold_model'])
def test_folding_keeps_frozen_stages_frozen(name, frozen_stages, how):
    """Checked right after the fold: a train() or eval() call in between would freeze the
    folded layers' new parameters itself and hide a fold that does not."""
    model = BACKBONES[name](frozen_stages=frozen_stages)
    stem = (model.stem_name + '.',)
    frozen = stem + tuple(f'stages.{i}.' for i in range(frozen_stages))
    frozen += tuple(f'norm{i}.' for i in range(frozen_stages))
    free = tuple(f'stages.{i}.' for i in range(frozen_stages, model.num_stages))
    for state in ('built', 'folded'):
        if state == 'folded' and how == 'switch_to_deploy':
            model.train().switch_to_deploy()  # in training mode, as mmdeploy calls it
        elif state == 'folded':
            model.eval()
            fold_model(model, logger=None)
        assert not _trainable(model, frozen), f'{state}: frozen parameters are trainable'
        assert _trainable(model, free), f'{state}: the stages after the frozen ones are frozen'
        assert all(not m.training for k, m in model.named_modules() if k.startswith(frozen) and k)
    model.train()
    assert not _trainable(model, frozen)


@pytest.mark.parametrize('name', ['repa_swin', 'repa_caformer', 'repa_mlp_mixer'])
def test_backbone_reparameterize_refuses_training_mode(name):
    model = BACKBONES[name]().train()
    with pytest.raises(FoldError, match='eval mode'):
        model.reparameterize()
    assert not model.deploy


@pytest.mark.parametrize('name', BACKBONES)
def test_folding_adds_no_parameter_that_is_zero_by_construction(name):
    """With every weight and statistic random, a parameter the fold creates is zero only if
    nothing could ever make it nonzero: such a parameter must not be created."""
    model = randomize_(BACKBONES[name]().double()).eval()
    for m in model.modules():  # StarReLU's bias is a scalar: randomized, it must move
        if hasattr(m, 'output_affine'):
            assert m.bias.abs().item() > 0
    before = sum(p.numel() for p in model.parameters())
    x = torch.randn(IMAGE, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        reparameterize(model)
        out = model(x)
    zero = [k for k, p in model.named_parameters() if p.numel() > 1 and not p.any()]
    assert not zero, f'parameters that are zero by construction: {zero}'
    after = sum(p.numel() for p in model.parameters())
    if 'repa' in name:
        assert after < before
    for r, o in zip(ref, out):
        assert ((r - o).abs().max() / r.abs().max()).item() < 1e-10
    # deploy=True builds exactly the parameters the fold left
    deployed = BACKBONES[name](deploy=True).double()
    assert {k: v.shape for k, v in deployed.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }


def test_published_caformer_fold_adds_only_the_starrelu_bias_vector():
    """StarReLU ``s·relu²(x) + b`` before fc2 (no bias) becomes ``relu²`` and a bias
    ``b·Σ_j W[:, j]`` on fc2: one (C,) vector per block instead of two scalars, nothing else."""
    model = BACKBONES['caformer']().eval()
    before = sum(p.numel() for p in model.parameters())
    blocks = [b for s in model.stages for b in s.blocks]
    reparameterize(model)
    sepconvs = sum(1 for b in blocks if hasattr(b.token_mixer, 'dwconv'))
    expected = sum(b.ffn.embed_dims - 2 for b in blocks) - sepconvs  # SepConv: (s, b) -> b/s
    assert sum(p.numel() for p in model.parameters()) - before == expected
    assert all(b.ffn.in_proj.bias is None for b in blocks)


@pytest.mark.parametrize('hw', [(12, 12), (10, 7)])
def test_shifted_windows_attend_within_the_shifted_grid(hw):
    """A token influences exactly the tokens of its own shifted window: windows start at
    ``shift - window`` in both directions and the wrapped-around parts are masked apart.

    A wrong roll direction moves the window boundaries, a missing mask joins the top-left and
    bottom-right parts; either changes which outputs move."""
    ws, shift, C = 4, 1, 8
    torch.manual_seed(0)
    attn = ShiftWindowMSA(C, num_heads=2, window_size=ws, shift_size=shift).double().eval()
    H, W = hw
    Hp, Wp = attn.padded_shape(hw)
    x = torch.randn(1, H * W, C, dtype=torch.float64)
    mask = shifted_window_mask(Hp, Wp, ws, shift, x.device)

    def group(i):
        return (i + ws - shift) // ws

    with torch.no_grad():
        ref = attn(x, hw, mask).view(H, W, C)
        for i, j in [(0, 0), (H - 1, W - 1), (2, 5), (H // 2, 0)]:
            y = x.clone().view(H, W, C)
            y[i, j] += 1.0
            changed = (attn(y.view(1, H * W, C), hw, mask).view(H, W, C) - ref).abs().amax(-1)
            expected = torch.tensor(
                [
                    [group(a) == group(i) and group(b) == group(j) for b in range(W)]
                    for a in range(H)
                ]
            )
            assert torch.equal(changed > 1e-12, expected), (i, j)


def test_frozen_stages_zero_freezes_the_stem_only():
    model = RePaSwin(TINY_ARCH, frozen_stages=0).train()
    assert not _trainable(model, ('patch_embed.',))
    assert not model.patch_embed.training
    assert _trainable(model, ('stages.0.',)) and model.stages[0].training
    copy.deepcopy(model)  # a frozen model stays copyable (the hook deep-copies it)
