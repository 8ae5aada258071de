"""Both directions of the deploy convention: other tools fold mmrepa models by their own calls,
and ``mmrepa.reparameterize`` folds other libraries' blocks by theirs."""

import copy
import logging

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger

import mmrepa
from mmrepa.backbones import CAFormer, PRepBNSwin, RePaSwin
from mmrepa.backbones.metaformer import SepConv
from mmrepa.layers import ChannelIdleFFN
from tests.helpers import TINY_ARCH, max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 comparisons at 1e-4 absolute on outputs of order 1: u32 times a size factor of ~10^3
# (the reductions through the model in two orders); observed ≤ 1.9e-6 (0.02 of it) on both
# kernel settings; empirical in the scale, not derived per element.

META = dict(depths=(1, 1, 2, 1), dims=(16, 32, 48, 64))
BACKBONES = {
    'repa_swin': lambda **kw: RePaSwin(TINY_ARCH, window_size=3, **kw),
    'prepbn_swin': lambda **kw: PRepBNSwin(TINY_ARCH, window_size=3, idle_ratio=0.5, **kw),
    'repa_caformer': lambda **kw: CAFormer(
        META, head_dim=16, idle_ratio=0.75, window_size=(None, None, 2, 2), **kw
    ),
}


def params(model):
    return sum(p.numel() for p in model.parameters())


def randomized(build):
    return randomize_(build().double()).eval()


@pytest.mark.parametrize('name', BACKBONES)
def test_switch_to_deploy_is_reparameterize(name):
    model = randomized(BACKBONES[name])
    x = torch.randn(1, 3, 37, 50, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        model.switch_to_deploy()
        assert model.deploy and all(getattr(m, 'deploy', True) for m in model.modules())
        assert max_abs_diff(model(x), ref) < 1e-10
        state = copy.deepcopy(model.state_dict())
        model.switch_to_deploy()  # idempotent
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    for layer in (ChannelIdleFFN(8), SepConv(8)):
        layer.eval().switch_to_deploy()
        assert layer.deploy


def test_mmpretrain_converter_call_sequence_folds_an_mmrepa_classifier(tmp_path):
    """mmpretrain's tools/model_converters/reparameterize_model.py: ``init_model`` (eval),
    ``model.backbone.switch_to_deploy()``, ``torch.save(model.state_dict())``; the result is
    loaded by the same config with ``deploy=True``."""
    from mmengine.registry import DefaultScope
    from mmpretrain.models import ImageClassifier
    from mmpretrain.registry import MODELS

    def classifier(deploy):
        # in mmpretrain's scope whatever an earlier test in this process left as default
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            return MODELS.build(
                dict(
                    type='ImageClassifier',
                    backbone=dict(
                        type='RePaSwin',
                        arch=TINY_ARCH,
                        window_size=3,
                        out_indices=(3,),
                        deploy=deploy,
                    ),
                    neck=dict(type='GlobalAveragePooling'),
                    head=dict(type='LinearClsHead', num_classes=5, in_channels=128),
                )
            )

    model = classifier(False)
    randomize_(model)
    model.eval()
    assert isinstance(model, ImageClassifier) and hasattr(model.backbone, 'switch_to_deploy')
    x = torch.randn(2, 3, 45, 45)
    with torch.no_grad():
        ref = model(x)
    model.backbone.switch_to_deploy()
    torch.save(model.state_dict(), tmp_path / 'deploy.pth')
    deployed = classifier(True)
    deployed.load_state_dict(torch.load(tmp_path / 'deploy.pth'))
    deployed.eval()
    with torch.no_grad():
        assert max_abs_diff(deployed(x), ref) < 1e-4


def test_mmdeploy_build_pytorch_model_sequence_folds_before_eval(tmp_path):
    """mmdeploy's ``build_pytorch_model``: build (training mode), ``load_checkpoint``,
    ``revert_sync_batchnorm``, ``model.backbone.switch_to_deploy()``, then ``eval()``."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.runner import load_checkpoint

    reference = torch.nn.Module()
    reference.backbone = randomize_(BACKBONES['repa_caformer']())
    path = str(tmp_path / 'model.pth')
    torch.save(dict(state_dict=reference.state_dict()), path)
    model = torch.nn.Module()
    model.backbone = BACKBONES['repa_caformer']()
    load_checkpoint(model, path)
    model = revert_sync_batchnorm(model)
    assert model.training
    model.backbone.switch_to_deploy()
    assert model.backbone.training and model.backbone.deploy  # its mode is left as it was
    model.eval()
    x = torch.randn(1, 3, 40, 52)
    with torch.no_grad():
        assert max_abs_diff(model.backbone(x), reference.eval().backbone(x)) < 1e-4


def test_generic_switch_to_deploy_loop_folds_a_whole_model():
    """RepVGG's ``repvgg_model_convert`` and mmyolo-style utilities: every module that has
    ``switch_to_deploy`` gets it called, outermost first."""
    model = nn.Sequential(randomized(BACKBONES['repa_caformer']))
    x = torch.randn(1, 3, 40, 52, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        for m in list(model.modules()):
            if hasattr(m, 'switch_to_deploy'):
                m.switch_to_deploy()
        assert max_abs_diff(model(x), ref) < 1e-10
    assert model[0].deploy


@pytest.mark.parametrize('name', BACKBONES)
def test_timm_reparameterize_model_folds_mmrepa_exactly(name):
    from timm.utils import reparameterize_model

    model = randomized(BACKBONES[name])
    x = torch.randn(1, 3, 37, 50, dtype=torch.float64)
    ours = mmrepa.reparameterize(copy.deepcopy(model))
    theirs = reparameterize_model(model)  # walks the children, outermost first
    with torch.no_grad():
        assert max_abs_diff(theirs(x), model(x)) < 1e-10
        assert max_abs_diff(theirs(x), ours(x)) < 1e-10
    assert params(theirs) == params(ours) < params(model)


def _random_bn_statistics(model):
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def _compare_folds(model, their_fold, x):
    theirs = their_fold(copy.deepcopy(model))
    report = mmrepa.fold_model(copy.deepcopy(model), logger=None)
    with torch.no_grad():
        out_theirs, out_ours = theirs(x), report.model(x)
    out_theirs = out_theirs[-1] if isinstance(out_theirs, tuple) else out_theirs
    out_ours = out_ours[-1] if isinstance(out_ours, tuple) else out_ours
    assert torch.equal(out_theirs, out_ours)
    assert params(theirs) == params(report.model) == report.params_after
    assert report.params_before == params(model)
    assert not report.unfolded
    return report


@pytest.mark.parametrize(
    'arch, blocks',
    [
        ('repvgg_a0', {'RepVggBlock': 22}),
        ('mobileone_s0', {'MobileOneBlock': 43}),
        ('fastvit_t8', {'MobileOneBlock': 27, 'RepMixer': 10, 'ReparamLargeKernelConv': 3}),
    ],
)
def test_mmrepa_folds_timm_models_as_timm_does(arch, blocks):
    import timm
    from timm.utils import reparameterize_model

    model = _random_bn_statistics(timm.create_model(arch, num_classes=10)).eval()
    report = _compare_folds(model, reparameterize_model, torch.randn(1, 3, 64, 64))
    assert report.folded == blocks
    assert report.params_after < report.params_before


def _mmpretrain_switch(model):
    model.switch_to_deploy()
    return model


@pytest.mark.parametrize(
    'arch, before, after',
    [
        ('RepVGG', 7_827_968, 7_028_384),
        ('MobileOne', 4_268_272, 1_053_504),
    ],
)
def test_mmrepa_folds_mmpretrain_blocks_whose_reparameterize_only_returns(arch, before, after):
    """mmpretrain's RepVGGBlock / MobileOneBlock ``reparameterize()`` returns fused tensors
    and changes nothing: ``switch_to_deploy()`` is the fold, and it must be the one used."""
    from mmpretrain.models import backbones

    model = getattr(backbones, arch)('A0' if arch == 'RepVGG' else 's0')
    _random_bn_statistics(model).eval()
    report = _compare_folds(model, _mmpretrain_switch, torch.randn(1, 3, 64, 64))
    assert (report.params_before, report.params_after) == (before, after)


def test_a_method_that_changes_nothing_is_not_a_fold_and_is_named():

    class ReturnsOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def reparameterize(self):
            return self.conv.weight * 2, self.conv.bias

    class Flagged(nn.Module):
        deploy = False

    model = nn.Sequential(ReturnsOnly(), Flagged()).eval()
    logger = MMLogger.get_current_instance()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        report = mmrepa.fold_model(model)
    finally:
        logger.removeHandler(handler)
    assert report.folded == {} and report.params_before == report.params_after
    assert any('0 (ReturnsOnly): reparameterize() changed nothing' in u for u in report.unfolded)
    assert any('1 (Flagged): deploy=False' in u for u in report.unfolded)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any('ReturnsOnly' in w and 'Flagged' in w for w in warnings)


def test_fuse_returning_a_replacement_is_applied():

    class ConvBN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x))

        def fuse(self):
            return torch.nn.utils.fusion.fuse_conv_bn_eval(self.conv, self.bn)

    model = _random_bn_statistics(nn.Sequential(ConvBN(), nn.ReLU())).eval()
    x = torch.randn(1, 3, 9, 9)
    with torch.no_grad():
        ref = model(x)
    report = mmrepa.fold_model(model, logger=None)
    assert isinstance(model[0], nn.Conv2d) and report.folded == {'ConvBN': 1}
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref)


@pytest.mark.parametrize('norm, counted', [('LN', False), ('BN1d', True)])
def test_setting_only_the_flag_is_not_counted_as_a_fold(norm, counted):
    """A LayerNorm patch embedding is in deployed form already: reparameterize() only sets
    its flag. The BatchNorm one folds its norm into the conv and is counted."""
    from mmrepa.layers import FoldablePatchEmbed

    embed = FoldablePatchEmbed(
        in_channels=3, embed_dims=8, kernel_size=4, stride=4, norm_cfg=dict(type=norm)
    )
    report = mmrepa.fold_model(nn.Sequential(embed).eval(), logger=None)
    assert embed.deploy is True and not report.unfolded
    assert report.folded == ({'FoldablePatchEmbed': 1} if counted else {})
