"""RePaViT and PRepBNViT: parity with timm's and mmpretrain's ViT, checkpoint loading through
init_cfg, exact folds, the published sizes' parameter counts, and one-line errors."""

import pytest
import torch

from mmrepa import reparameterize
from mmrepa.backbones import DepthRepViT, PRepBNViT, RePaSwin, RePaViT
from mmrepa.engine.hooks import PRepBNScheduleHook
from mmrepa.errors import CheckpointError, ConfigError
from tests.helpers import TINY_ARCH, randomize_

ARCH = dict(embed_dims=24, num_layers=3, num_heads=3)
SMALL = dict(img_size=32, patch_size=8, drop_path_rate=0.0)


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _timm_vit(pool, depth=3):
    import timm

    return timm.create_model(
        'deit_tiny_patch16_224',
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=24,
        depth=depth,
        num_heads=3,
        num_classes=0,
        global_pool='token' if pool == 'cls' else 'avg',
    )


def _load(model, state_dict, tmp_path, name='ckpt.pth'):
    path = tmp_path / name
    torch.save(state_dict, path)
    model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model.init_weights()
    return model


@pytest.mark.parametrize('pool', ['cls', 'avg'])
@pytest.mark.parametrize('family', ['repa_vit', 'prepbn_vit'])
def test_unfolded_equals_timm_vit_from_its_checkpoint(pool, family, tmp_path):
    """idle_ratio = 0 with the LayerNorm FFN (RePaViT), or λ = 1 while training (PRepBNViT),
    is timm's DeiT, loaded from a timm state dict through init_cfg; float64."""
    torch.manual_seed(0)
    ref = randomize_(_timm_vit(pool)).double().train()  # no dropout: train mode is exact
    kw = dict(with_cls_token=True, out_type=pool, **SMALL)
    if family == 'repa_vit':
        model = RePaViT(ARCH, idle_ratio=0, ffn_norm='LN', **kw)
    else:
        model = PRepBNViT(ARCH, **kw)
        assert {m.current_lambda for m in model.prepbn_layers()} == {1.0}
    model = _load(model.double(), ref.state_dict(), tmp_path).train()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    assert _rel(model(x)[0], ref(x)) < 1e-10


@pytest.mark.parametrize('pool', ['cls', 'avg'])
def test_unfolded_equals_mmpretrain_vit_from_a_classifier_checkpoint(pool, tmp_path):
    from mmpretrain.models import VisionTransformer

    arch = dict(ARCH, feedforward_channels=96)
    ref = VisionTransformer(
        arch,
        img_size=32,
        patch_size=8,
        out_type='cls_token' if pool == 'cls' else 'avg_featmap',
        final_norm=pool == 'cls',
    )
    randomize_(ref).double().eval()  # its train() returns None
    model = RePaViT(ARCH, idle_ratio=0, ffn_norm='LN', out_type=pool, **SMALL).double()
    ckpt = {'state_dict': {f'backbone.{k}': v for k, v in ref.state_dict().items()}}
    model = _load(model, ckpt, tmp_path).eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    assert _rel(model(x)[0], ref(x)[0]) < 1e-10


def test_own_checkpoint_loads_from_a_whole_detector(tmp_path):
    src = randomize_(RePaViT(ARCH, idle_ratio=0.5, **SMALL)).double().eval()
    ckpt = {'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()}}
    ckpt['state_dict']['neck.conv.weight'] = torch.zeros(1)
    model = _load(RePaViT(ARCH, idle_ratio=0.5, **SMALL).double(), ckpt, tmp_path).eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    assert torch.equal(model(x)[0], src(x)[0])


@pytest.mark.parametrize(
    'make',
    [
        # odd token counts (5 x 7 + class token), BatchNorm FFN, ViT-L-like global blocks
        lambda **kw: RePaViT(ARCH, idle_ratio=0.75, **SMALL, **kw),
        # SLAB-DeiT: linear attention over the whole (odd, 5 x 5) grid, average pooling
        lambda **kw: PRepBNViT(
            ARCH,
            idle_ratio=0.5,
            attn_types='L',
            with_cls_token=False,
            out_type='avg',
            img_size=40,
            patch_size=8,
            **kw,
        ),
    ],
    ids=['repa_deit_cls', 'slab_deit'],
)
def test_fold_is_exact_and_deploy_builds_the_folded_form(make):
    x = torch.randn(2, 3, 40, 56, dtype=torch.float64)  # 5 x 7 tokens (SLA: 5 x 5 resized)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        model = randomize_(make()).to(dtype).eval()
        with torch.no_grad():
            ref = model(x.to(dtype))[0]
            reparameterize(model)
            out = model(x.to(dtype))[0]
        assert _rel(out, ref) < tol, dtype
    assert all(block.ffn.deploy for block in model.stages)
    deployed = make(deploy=True)
    assert {k: v.shape for k, v in deployed.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }


# The paper's (RePaFormer Table 1) parameter counts in millions, with a 1000-class head.
PAPER_PARAMS = {
    'tiny': (5.7, 3.5),
    'small': (22.1, 13.2),
    'base': (86.6, 51.1),
    'large': (304.5, 178.4),
    'huge': (632.5, 369.9),
}


@pytest.mark.parametrize('size', PAPER_PARAMS)
def test_published_sizes_have_the_papers_parameter_counts(size):
    """Built on the meta device (no memory, no time); the head (C x 1000 + 1000) added."""

    def millions(model):
        return (sum(p.numel() for p in model.parameters()) + model.embed_dims * 1001) / 1e6

    with torch.device('meta'):
        unfolded = millions(RePaViT(size))
        folded = millions(RePaViT(size, deploy=True))
    before, after = PAPER_PARAMS[size]
    # the paper's rounding (0.1 M); ViT-H/14's patch embedding would be 0.23 M off
    assert abs(unfolded - before) <= 0.05, unfolded
    assert abs(folded - after) <= 0.05, folded


def test_named_size_has_timm_deit_small_shapes():
    import timm

    with torch.device('meta'):
        ours = RePaViT('small', idle_ratio=0, ffn_norm='LN')
        ref = timm.create_model('deit_small_patch16_224', pretrained=False, num_classes=0)
    converted = ours.filter_checkpoint(ref.state_dict())
    own = ours.state_dict()
    assert {k: v.shape for k, v in converted.items() if k in own} == {
        k: v.shape for k, v in own.items()
    }


def test_prepbn_schedule_hook_finds_every_prepbn_of_the_vit():
    model = PRepBNViT(ARCH, **SMALL)
    names = [name for name, _ in PRepBNScheduleHook(decay_iters=10).find_layers(model)]
    assert len(names) == 2 * len(model.stages)
    reparameterize(model.eval())
    assert not PRepBNScheduleHook(decay_iters=10).find_layers(model)


def _one_line(excinfo):
    assert '\n' not in str(excinfo.value)
    return str(excinfo.value)


@pytest.mark.parametrize('ratio', [-0.1, 1.5])
def test_idle_ratio_outside_the_unit_interval_is_refused(ratio):
    with pytest.raises(ConfigError, match='idle_ratio must be in') as e:
        RePaViT(ARCH, idle_ratio=ratio, **SMALL)
    _one_line(e)


def test_unknown_size_lists_the_choices():
    with pytest.raises(ConfigError) as e:
        RePaViT('gigantic')
    assert all(size in _one_line(e) for size in PAPER_PARAMS)


def test_checkpoints_of_another_family_or_size_are_refused(tmp_path):
    swin = {f'backbone.{k}': v for k, v in RePaSwin(TINY_ARCH).state_dict().items()}
    joined = DepthRepViT(dict(ARCH, num_layers=6), num_branches=2, img_size=32).state_dict()
    for other in (swin, joined):
        with pytest.raises(CheckpointError, match='another family') as e:
            _load(RePaViT(ARCH, **SMALL), other, tmp_path)
        _one_line(e)
    deeper = _timm_vit('cls', depth=4).state_dict()
    with pytest.raises(CheckpointError, match='another size') as e:
        _load(RePaViT(ARCH, **SMALL), deeper, tmp_path)
    _one_line(e)
    wider = RePaViT(dict(ARCH, embed_dims=48), **SMALL).state_dict()
    with pytest.raises(CheckpointError, match='does not fit') as e:
        _load(RePaViT(ARCH, **SMALL), wider, tmp_path)
    _one_line(e)
    batchnorm_ffn = RePaViT(ARCH, idle_ratio=0, **SMALL).state_dict()
    with pytest.raises(CheckpointError, match='plain BatchNorm') as e:
        _load(PRepBNViT(ARCH, **SMALL), batchnorm_ffn, tmp_path)
    _one_line(e)
