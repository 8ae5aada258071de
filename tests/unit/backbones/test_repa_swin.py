import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import reparameterize
from mmrepa.backbones import RePaSwin
from mmrepa.backbones.swin import ARCH_SETTINGS
from tests.helpers import TINY_ARCH, max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 backbone folds at 1e-4 ≈ 1680·u32 of each output's scale: u32 times the summed
# reduction lengths through the stages; observed ≤ 0.006 of it on both kernel settings.


def tiny(dtype=torch.float64, **kw):
    kw.setdefault('drop_path_rate', 0.0)
    model = RePaSwin(arch=TINY_ARCH, window_size=7, **kw)
    return randomize_(model).to(dtype).eval()


# sizes that are multiples of neither the window (7 * 4 px) nor 32
SIZES = [(75, 101), (33, 47), (129, 66)]


@pytest.mark.parametrize('hw', SIZES)
@pytest.mark.parametrize('idle', [0.75, [0.0, 0.5, 0.75, 1.0]])
def test_backbone_fold_is_exact_in_float64(hw, idle):
    model = tiny(idle_ratio=idle)
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    ref = model(x)
    folded = reparameterize(copy.deepcopy(model))
    assert folded.deploy
    assert max_abs_diff(folded(x), ref) <= 1e-10


@pytest.mark.parametrize('ffn_norm', ['BN', 'LN'])
def test_backbone_fold_is_close_in_float32(ffn_norm):
    model = tiny(torch.float32, ffn_norm=ffn_norm)
    x = torch.randn(1, 3, 75, 101)
    ref = model(x)
    out = reparameterize(copy.deepcopy(model))(x)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


def test_deploy_round_trip_and_idempotence():
    model = tiny()
    x = torch.randn(1, 3, 61, 90, dtype=torch.float64)
    ref = model(x)
    reparameterize(model)
    state = copy.deepcopy(model.state_dict())
    reparameterize(model)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    deployed = RePaSwin(arch=TINY_ARCH, deploy=True).double().eval()
    deployed.load_state_dict(state)  # strict: same structure
    assert max_abs_diff(deployed(x), ref) <= 1e-10


def test_outputs_strides_and_out_indices():
    model = RePaSwin(arch=TINY_ARCH, out_indices=(1, 3)).eval()
    outs = model(torch.randn(2, 3, 100, 130))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 13, 17), (2, 128, 4, 5)]
    assert not hasattr(model, 'norm0') and hasattr(model, 'norm1')


def test_norm_eval_freezes_batchnorm_statistics_only():
    model = RePaSwin(arch=TINY_ARCH, norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and all(not m.training for m in bns)
    assert all(m.weight.requires_grad for m in bns)
    before = [m.running_mean.clone() for m in bns]
    model(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(b, m.running_mean) for b, m in zip(before, bns))
    assert model.stages[0].blocks[0].attn.training  # everything else still trains


def test_norm_eval_covers_sync_batchnorm():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(RePaSwin(arch=TINY_ARCH, norm_eval=True))
    model.train()
    syncs = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    assert syncs and all(not m.training for m in syncs)


def test_frozen_stages():
    model = RePaSwin(arch=TINY_ARCH, frozen_stages=2).train()
    frozen = [model.patch_embed, model.stages[0], model.stages[1], model.norm0, model.norm1]
    for m in frozen:
        assert not m.training and all(not p.requires_grad for p in m.parameters())
    for m in (model.stages[2], model.norm2):
        assert m.training and all(p.requires_grad for p in m.parameters())


def test_with_cp_gives_the_same_gradients():
    torch.manual_seed(1)
    plain = RePaSwin(arch=TINY_ARCH, drop_path_rate=0.0).train()
    cp = RePaSwin(arch=TINY_ARCH, drop_path_rate=0.0, with_cp=True).train()
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 80)
    for m in (plain, cp):
        sum(o.sum() for o in m(x)).backward()
    for (n, p), q in zip(plain.named_parameters(), cp.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='huge'), r"unknown arch 'huge'"),
        (dict(idle_ratio=-0.1), r'idle_ratio must be in \[0, 1\]'),
        (dict(idle_ratio='0.5'), r"idle_ratio must be in \[0, 1\].*got '0.5'"),
        (dict(idle_ratio=True), r'idle_ratio must be in \[0, 1\].*got True'),
        (dict(idle_ratio=[0.5, 0.5]), r'idle_ratio has 2 entries but the arch has 4 stages'),
        (dict(window_size=0), r'window_size must be an integer >= 1'),
        (dict(out_indices=(4,)), r'out_indices .* \[0, 3\]'),
        (dict(frozen_stages=5), r'frozen_stages must be in \[-1, 4\]'),
        (dict(ffn_norm='GN'), r"ffn_norm must be 'BN' or 'LN'"),
    ],
)
def test_bad_options_say_what_is_wrong(kwargs, message):
    kwargs.setdefault('arch', TINY_ARCH)
    with pytest.raises(ValueError, match=message):
        RePaSwin(**kwargs)


def test_bad_input_says_what_is_expected():
    model = RePaSwin(arch=TINY_ARCH).eval()
    with pytest.raises(ValueError, match=r'expects input \(B, 3, H, W\)'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='smaller than the patch size'):
        model(torch.randn(1, 3, 2, 64))


def _params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('arch', ['tiny', 'small', 'base'])
def test_fused_backbone_loses_five_c_squared_per_block(arch):
    model = RePaSwin(arch=arch).eval()
    before = _params(model)
    reparameterize(model)
    settings = ARCH_SETTINGS[arch]
    C0, depths = settings['embed_dims'], settings['depths']
    lost = sum(5 * (C0 * 2**i) ** 2 * d for i, d in enumerate(depths))
    # per block, besides 5C^2 weights: the biases of fc1 (4C) and fc2 (C) and the BN affine
    # parameters (2C + 8C) go; in_proj's bias (a + C = 2C) comes: 13C fewer
    small_terms = sum(13 * C0 * 2**i * d for i, d in enumerate(depths))
    assert before - _params(model) == lost + small_terms


@pytest.mark.parametrize(
    'arch, before_m, after_m', [('tiny', 28.3, 17.5), ('small', 49.7, 29.9), ('base', 87.9, 52.8)]
)
def test_classification_counts_match_the_paper(arch, before_m, after_m):
    # classification model = backbone with the last output norm as final norm + 1000-way head
    model = RePaSwin(arch=arch, out_indices=(3,)).eval()
    head = 1000 * model.num_features[-1] + 1000
    assert round((_params(model) + head) / 1e6, 1) == before_m
    reparameterize(model)
    assert round((_params(model) + head) / 1e6, 1) == after_m


def test_vanilla_counts_match_mmdet_swin():
    # mmdet's SwinTransformer-T/S/B backbones (no head) have 27.5 / 48.8 / 86.7 M parameters
    for arch, expected in (('tiny', 27.5), ('small', 48.8), ('base', 86.7)):
        model = RePaSwin(arch=arch, idle_ratio=0.0, ffn_norm='LN')
        assert round(_params(model) / 1e6, 1) == expected


def test_a_mmdet_swin_config_switches_to_repa_swin_by_its_type_alone(tmp_path):
    """Users change ``type`` in an inherited mmdet Swin backbone; its arguments must work."""
    from mmdet.registry import MODELS
    from mmengine.config import Config

    path = tmp_path / 'config.py'
    path.write_text(
        "_base_ = 'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py'\n"
        "model = dict(backbone=dict(type='RePaSwin'))\n"
    )
    cfg = Config.fromfile(str(path)).model.backbone
    backbone = MODELS.build(cfg)
    assert backbone.embed_dims == 96 and backbone.out_indices == (1, 2, 3)
    assert [len(s.blocks) for s in backbone.stages] == [2, 2, 6, 2]
    assert backbone.init_cfg == cfg.init_cfg
    small = MODELS.build(dict(cfg, depths=[2, 2, 18, 2]))
    assert [len(s.blocks) for s in small.stages] == [2, 2, 18, 2]


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (
            dict(arch='base', embed_dims=96),
            r"arch='base' has embed_dims=128 but embed_dims=96 .*"
            r'_delete_=True',
        ),
        (dict(strides=(4, 2, 1, 2)), r'strides=\(4, 2, 1, 2\).*set patch_size'),
        (dict(use_abs_pos_embed=True), 'no absolute position embedding'),
        (
            dict(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth')),
            'either as init_cfg or as pretrained',
        ),
    ],
)
def test_mmdet_swin_arguments_that_mean_nothing_here_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RePaSwin(**kwargs)


def test_mmdet_pretrained_argument_becomes_init_cfg():
    with pytest.warns(UserWarning, match='pretrained is deprecated'):
        model = RePaSwin(
            arch=TINY_ARCH,
            pretrained='swin.pth',
            strides=(4, 2, 2, 2),
            convert_weights=True,
            pretrain_img_size=384,
        )
    assert model.init_cfg == dict(type='Pretrained', checkpoint='swin.pth')
