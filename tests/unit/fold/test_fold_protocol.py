import copy
import importlib
import inspect
import pkgutil

import pytest
import torch
import torch.nn as nn

import mmrepa
from mmrepa import FoldError, fold_model, reparameterize
from mmrepa.backbones import RePaSwin
from mmrepa.backbones.metaformer import SepConv
from mmrepa.fold import all_or_nothing, check_foldable, checks, find_fold_problems
from mmrepa.layers import ChannelIdleFFN
from tests.helpers import TINY_ARCH, max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.


class Recorder(nn.Module):
    """A foldable module that records the order in which folds happen."""

    def __init__(self, log, name, child=None):
        super().__init__()
        self.log, self.name, self.child, self.deploy = log, name, child, False

    def reparameterize(self):
        if not self.deploy:
            self.log.append(self.name)
            self.deploy = True


def test_folds_deepest_first_and_is_idempotent():
    log = []
    model = Recorder(log, 'outer', Recorder(log, 'middle', Recorder(log, 'inner'))).eval()
    assert reparameterize(model) is model
    assert log == ['inner', 'middle', 'outer']
    reparameterize(model)
    assert log == ['inner', 'middle', 'outer']


def test_training_mode_is_refused_with_a_clear_message():
    model = nn.Sequential(ChannelIdleFFN(8))
    with pytest.raises(FoldError, match=r'eval mode.*model\.eval\(\)'):
        reparameterize(model)
    # norm_eval-style: BN in eval but the FFN itself training is still refused
    model[0].norm1.eval()
    with pytest.raises(FoldError, match=r'first: 0\.norm2'):
        reparameterize(model)


def test_methods_named_reparameterize_with_arguments_are_not_called():

    class VAE(nn.Module):
        def reparameterize(self, mu, logvar):  # the other meaning of the word
            raise AssertionError('must not be called')

    reparameterize(nn.Sequential(VAE()).eval())


def test_non_finite_bn_statistics_name_the_module():
    model = nn.Sequential(nn.Linear(4, 4), ChannelIdleFFN(8)).eval()
    model[1].norm2.running_var[3] = float('nan')
    with pytest.raises(FoldError, match=r'1 \(ChannelIdleFFN\).*not finite'):
        reparameterize(model)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_folded_modules_keep_device_and_dtype(dtype):
    ffn = randomize_(ChannelIdleFFN(8)).to(dtype).eval()
    reparameterize(ffn)
    for p in ffn.parameters():
        assert p.dtype == dtype and p.device == torch.device('cpu')


def test_public_api():
    assert mmrepa.reparameterize is reparameterize
    assert issubclass(mmrepa.FoldError, RuntimeError)
    copy.deepcopy(ChannelIdleFFN(4))  # modules stay deep-copyable (the hook relies on it)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_models_fold_in_high_precision(dtype):
    half = randomize_(ChannelIdleFFN(32, idle_ratio=0.5)).to(dtype).eval()
    wide = copy.deepcopy(half).float()  # the same values, exactly representable in fp32
    reparameterize(half)
    reparameterize(wide)
    for (name, p), q in zip(half.named_parameters(), wide.parameters()):
        assert p.dtype == dtype
        # folding in half precision would round every intermediate product; we do not
        assert torch.equal(p, q.to(dtype)), name


# ------------------------------------------------------------------ all or nothing


def _everything(model):
    """What a fold could change: structure and types (``str``), every tensor's value, every
    parameter's identity and ``requires_grad``, every ``deploy`` and training flag."""
    return dict(
        text=str(model),
        state={k: v.detach().clone() for k, v in model.state_dict().items()},
        params={k: (id(p), p.requires_grad) for k, p in model.named_parameters()},
        deploy={k: getattr(m, 'deploy', None) for k, m in model.named_modules()},
        training={k: m.training for k, m in model.named_modules()},
    )


def _assert_unchanged(model, before):
    after = _everything(model)
    assert after['text'] == before['text']
    assert after['state'].keys() == before['state'].keys()
    for key, value in before['state'].items():  # torch.equal, with NaN equal to NaN
        now = after['state'][key]
        assert torch.equal(now.isnan(), value.isnan()), key
        assert torch.equal(now.nan_to_num(), value.nan_to_num()), key
    assert after['params'] == before['params']
    assert after['deploy'] == before['deploy']
    assert after['training'] == before['training']


def _depth_rep_vit_with_one_ffn_mid_ramp():
    """Four joined blocks at λ = 1, but the last FFN at λ = 0.5: it is folded after the three
    blocks before it and the attention beside it."""
    from mmrepa.backbones import DepthRepViT

    model = DepthRepViT(
        dict(embed_dims=16, num_layers=8, num_heads=2),
        num_branches=2,
        join='qkv',
        img_size=32,
        join_lambda=1.0,
    )
    model.stages[-1].mlp.set_join_lambda(0.5)
    return randomize_(model).eval(), r'stages\.3\.mlp \(JoinedFFN\): join_lambda = 0\.5'


def _repa_swin_with_nan_statistics_in_the_last_block():
    """BatchNorm block norms, so that every block's fold rewrites its qkv in place; one NaN
    in the running variance of the last block's FFN."""
    model = randomize_(RePaSwin(TINY_ARCH, window_size=3, norm_cfg=dict(type='BN1d'))).eval()
    model.stages[-1].blocks[-1].ffn.norm2.running_var[2] = float('nan')
    return model, (
        r'stages\.3\.blocks\.1\.ffn \(ChannelIdleFFN\): norm2 \(BatchNorm1d\): '
        r'BatchNorm running statistics are not finite'
    )


def _repvgg_with_nan_statistics_in_the_last_layer():
    """A RepVGG (three branches per layer, each with its BatchNorm): the 1x1 branch's
    statistics of the last layer are not finite; every layer before it would fold."""
    from mmrepa.backbones import RepOptVGG

    model = RepOptVGG(dict(depths=(1, 2, 1, 1), widths=(8, 8, 16, 16), stem_width=8), mode='repvgg')
    randomize_(model).eval()
    model.stage4[-1].rbr_1x1.bn.running_var[1] = float('nan')
    return model, (
        r'stage4\.0 \(RepVGGConvBN\): rbr_1x1\.bn \(BatchNorm2d\): BatchNorm running '
        r'statistics are not finite'
    )


REFUSED = {
    'depth_rep_vit_ffn_mid_ramp': _depth_rep_vit_with_one_ffn_mid_ramp,
    'repa_swin_nan_in_last_block': _repa_swin_with_nan_statistics_in_the_last_block,
    'repvgg_nan_in_last_layer': _repvgg_with_nan_statistics_in_the_last_layer,
}


@pytest.mark.parametrize('name', REFUSED)
@pytest.mark.parametrize('how', ['fold_model', 'reparameterize', 'method', 'switch_to_deploy'])
def test_a_refused_fold_changes_nothing(name, how, monkeypatch):
    """A deep module refuses: nothing is folded, not even the modules folded before it. The
    check refuses before the first change: nothing needs undoing."""
    model, message = REFUSED[name]()
    before = _everything(model)

    def restore(snapshot):
        raise AssertionError('the fold was refused after it had changed the model')

    monkeypatch.setattr(checks._Snapshot, 'restore', restore)
    fold = dict(
        fold_model=lambda: fold_model(model, logger=None),
        reparameterize=lambda: reparameterize(model),
        method=model.reparameterize,
        switch_to_deploy=model.switch_to_deploy,
    )[how]
    if how == 'method':  # named relative to the module whose reparameterize() was called
        message = type(model).__name__ + ' at ' + message
    with pytest.raises(FoldError, match=message) as info:
        fold()
    assert '\n' not in str(info.value)
    _assert_unchanged(model, before)


def test_the_check_changes_nothing_and_names_every_problem():
    model, _ = _depth_rep_vit_with_one_ffn_mid_ramp()
    model.stages[0].attn.set_join_lambda(0.25)
    before = _everything(model)
    problems = find_fold_problems(model)
    assert [(path, type(m).__name__) for path, m, _ in problems] == [
        ('stages.0.attn', 'JoinedAttention'),
        ('stages.3.mlp', 'JoinedFFN'),
    ]
    with pytest.raises(
        FoldError,
        match=r'stages\.0\.attn .*join_lambda = 0\.25.*'
        r'\[1 more problem\(s\): DepthRepViT at stages\.3\.mlp',
    ):
        check_foldable(model)
    _assert_unchanged(model, before)


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize('how', ['fold_model', 'method', 'switch_to_deploy'])
def test_a_fold_failing_midway_is_undone(how):
    """An error after the check passed (a foreign fold raising, memory running out): the
    last block's FFN folds itself, then raises. By then the blocks before it have folded
    their norms into qkv in place, FFNs have been replaced and parameters created; all of it
    is undone, and the model still folds afterwards."""
    model = randomize_(RePaSwin(TINY_ARCH, window_size=3, norm_cfg=dict(type='BN1d'))).eval()
    model.double()
    x = torch.randn(1, 3, 29, 35, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
    before = _everything(model)
    ffn = model.stages[-1].blocks[-1].ffn

    def fold_then_fail(policy=None):
        ChannelIdleFFN.reparameterize(ffn, policy)
        raise _Interrupted('simulated failure in the middle of the fold')

    ffn.reparameterize = fold_then_fail  # the walk and the backbone call it by this name
    fold = dict(
        fold_model=lambda: fold_model(model, logger=None),
        method=model.reparameterize,
        switch_to_deploy=model.switch_to_deploy,
    )[how]
    with pytest.raises(_Interrupted):
        fold()
    del ffn.reparameterize
    _assert_unchanged(model, before)
    with torch.no_grad():
        assert all(torch.equal(o, r) for o, r in zip(model(x), ref))
        reparameterize(model)
        assert max_abs_diff(model(x), ref) < 1e-10
    assert model.stages[0].blocks[0].norm1 is None and model.stages[-1].blocks[-1].ffn.deploy


def test_an_undone_fold_keeps_hooks_and_shared_tensors():
    """The restore works in place: a hook registered before the fold can still be removed
    through its handle, and tensors that shared storage still do."""
    ffn = randomize_(ChannelIdleFFN(8)).eval()
    calls = []
    handle = ffn.register_forward_hook(lambda *args: calls.append(1))
    view = ffn.fc1.weight.detach()[:2]  # shares fc1.weight's storage
    with pytest.raises(_Interrupted):
        with all_or_nothing(ffn):
            ffn.reparameterize()
            with torch.no_grad():
                ffn.in_proj.weight.zero_()
            raise _Interrupted
    assert not ffn.deploy and hasattr(ffn, 'fc1')
    with torch.no_grad():
        ffn.fc1.weight[0, 0] = 123.0
    assert view[0, 0] == 123.0
    ffn(torch.randn(3, 8))
    handle.remove()
    ffn(torch.randn(3, 8))
    assert calls == [1]


# ------------------------------------------------------------------ every foldable class


def _foldable_classes():
    """Every class in mmrepa with a ``reparameterize`` method, by qualified name."""
    found = {}
    for info in pkgutil.walk_packages(mmrepa.__path__, 'mmrepa.'):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and obj.__module__.startswith('mmrepa.')
                and callable(getattr(obj, 'reparameterize', None))
            ):
                found[f'{obj.__module__}.{obj.__qualname__}'] = obj
    return found


def _swin_block():
    from mmrepa.backbones.swin import RePaSwinBlock

    return RePaSwinBlock(
        8, 2, 2, shift=True, norm_cfg=dict(type='BN1d'), ffn_cfg=dict(idle_ratio=0.5)
    )


def _metaformer_block():
    from mmrepa.backbones.metaformer import MetaFormerBlock

    return MetaFormerBlock(8, SepConv(8), idle_ratio=0.5, res_scale=True)


def _build(path: str):
    key = path[len('mmrepa.') :]
    builders = _backbone_builders()
    return (builders[key] if key in builders else _block_builders()[key])()


def _backbone_builders() -> dict:
    from mmrepa.backbones import (
        CAFormer,
        ConvFormer,
        DepthRepViT,
        IdentityFormer,
        MLPMixer,
        PoolFormer,
        PoolFormerV2,
        PRepBNPVT,
        PRepBNSwin,
        PRepBNViT,
        RandFormer,
        RePaViT,
        RepOptVGG,
    )
    from mmrepa.backbones.metaformer import MetaFormer
    from mmrepa.selfsup.mae import MAEDepthRepViT

    meta = dict(depths=(1, 1, 1, 1), dims=(8, 8, 16, 16))
    vgg = dict(depths=(1, 2, 1, 1), widths=(8, 8, 16, 16), stem_width=8)
    vit = dict(embed_dims=8, num_layers=2, num_heads=2)
    pvt = dict(embed_dims=8, num_layers=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))
    mixer = dict(embed_dims=8, num_layers=2, tokens_mlp_dims=8, channels_mlp_dims=16, patch_size=8)
    return {
        'backbones.mlp_mixer.MLPMixer': lambda: MLPMixer(mixer, img_size=32, idle_ratio=0.5),
        'backbones.prepbn_pvt.PRepBNPVT': lambda: PRepBNPVT(pvt, pretrain_img_size=64),
        'backbones.prepbn_vit.PRepBNViT': lambda: PRepBNViT(vit, img_size=32),
        'backbones.repa_vit.RePaViT': lambda: RePaViT(vit, img_size=32, idle_ratio=0.5),
        'backbones.depth_rep_vit.backbone.DepthRepViT': lambda: DepthRepViT(
            dict(embed_dims=8, num_layers=4, num_heads=2),
            num_branches=2,
            img_size=32,
            join_lambda=1.0,
        ),
        'selfsup.mae.MAEDepthRepViT': lambda: MAEDepthRepViT(
            arch=dict(embed_dims=8, num_layers=4, num_heads=2),
            num_branches=2,
            img_size=32,
            join_lambda=1.0,
        ),
        'backbones.metaformer.backbone.CAFormer': lambda: CAFormer(
            meta, head_dim=8, idle_ratio=0.5
        ),
        'backbones.metaformer.backbone.ConvFormer': lambda: ConvFormer(meta, idle_ratio=0.5),
        'backbones.metaformer.backbone.MetaFormer': lambda: MetaFormer(
            meta, ('conv',) * 4, idle_ratio=0.5
        ),
        'backbones.metaformer.backbone.PoolFormer': lambda: PoolFormer(meta, idle_ratio=0.5),
        'backbones.metaformer.backbone.PoolFormerV2': lambda: PoolFormerV2(meta, idle_ratio=0.5),
        'backbones.metaformer.backbone.IdentityFormer': lambda: IdentityFormer(
            meta, idle_ratio=0.5
        ),
        'backbones.metaformer.backbone.RandFormer': lambda: RandFormer(
            meta, img_size=64, idle_ratio=0.5
        ),
        'backbones.swin.prepbn_swin.PRepBNSwin': lambda: PRepBNSwin(
            TINY_ARCH, window_size=3, idle_ratio=0.5
        ),
        'backbones.swin.repa_swin.RePaSwin': lambda: RePaSwin(TINY_ARCH, window_size=3),
        'backbones.repopt_vgg.backbone.RepOptVGG': lambda: RepOptVGG(vgg, mode='repvgg'),
    }


def _block_builders() -> dict:
    from mmrepa.backbones import (
        PRepBNPVT,
        RePaViT,
    )
    from mmrepa.backbones.depth_rep_vit import JoinedAttention, JoinedBlock, JoinedFFN
    from mmrepa.backbones.repopt_vgg import CSLAConvBN, RepOptConvBN, RepVGGConvBN
    from mmrepa.backbones.swin import FoldablePatchMerging
    from mmrepa.layers import ConvPatchEmbed, FoldablePatchEmbed

    vit = dict(embed_dims=8, num_layers=2, num_heads=2)
    pvt = dict(embed_dims=8, num_layers=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))
    return {
        'backbones.prepbn_pvt.PVTBlock': lambda: PRepBNPVT(pvt).stages[0].blocks[0],
        'backbones.prepbn_pvt.SpatialReductionAttention': lambda: (
            PRepBNPVT(pvt).stages[0].blocks[0].attn
        ),
        'backbones.repa_vit.RePaViTBlock': lambda: RePaViT(vit, img_size=32).stages[0],
        'backbones.metaformer.blocks.MetaFormerBlock': _metaformer_block,
        'backbones.swin.blocks.RePaSwinBlock': _swin_block,
        'layers.channel_idle_ffn.ChannelIdleFFN': lambda: ChannelIdleFFN(8),
        'backbones.depth_rep_vit.attention.JoinedAttention': lambda: JoinedAttention(
            8, 2, 2, join_lambda=1.0
        ),
        'backbones.depth_rep_vit.block.JoinedBlock': lambda: JoinedBlock(8, 2, 2, join_lambda=1.0),
        'backbones.depth_rep_vit.ffn.JoinedFFN': lambda: JoinedFFN(8, 2.0, 2, join_lambda=1.0),
        'layers.patch_layers.FoldablePatchEmbed': lambda: FoldablePatchEmbed(
            in_channels=3, embed_dims=8, kernel_size=4, stride=4, norm_cfg=dict(type='BN1d')
        ),
        'layers.patch_layers.ConvPatchEmbed': lambda: ConvPatchEmbed(3, 8, 8, stem_channels=8),
        'backbones.swin.patch_merging.FoldablePatchMerging': lambda: FoldablePatchMerging(
            in_channels=8, out_channels=16, norm_cfg=dict(type='BN1d')
        ),
        'backbones.repopt_vgg.blocks.CSLAConvBN': lambda: CSLAConvBN(8, 8),
        'backbones.repopt_vgg.blocks.RepOptConvBN': lambda: RepOptConvBN(8, 8),
        'backbones.repopt_vgg.blocks.RepVGGConvBN': lambda: RepVGGConvBN(8, 8),
        'backbones.metaformer.sep_conv.SepConv': lambda: SepConv(8),
    }


# Bases that are not modules of their own: each concrete subclass is tested.
ABSTRACT = {
    'mmrepa.fold.base.Reparameterizable',
    'mmrepa.backbones.base.DenseBackbone',
    'mmrepa.backbones.plain_vit.PlainViT',
    'mmrepa.layers.patch_layers.NormFolding',
    'mmrepa.layers.prenorm_block.PreNormBlock',
    'mmrepa.backbones.repopt_vgg.blocks._RepOptLayer',
    'mmrepa.backbones.metaformer.backbone._PoolFormerV2Body',
}
FOLDABLE = sorted(_foldable_classes())


def test_every_foldable_class_is_tested():
    assert set(ABSTRACT) <= set(FOLDABLE)
    for path in FOLDABLE:
        assert issubclass(_foldable_classes()[path], mmrepa.fold.Reparameterizable), path
        if path not in ABSTRACT:
            _build(path)  # a KeyError here: add the new class to _build


@pytest.mark.parametrize('path', [p for p in FOLDABLE if p not in ABSTRACT])
def test_every_foldable_module_refuses_training_mode_and_folds_in_eval_mode(path):
    module = randomize_(_build(path))
    module.train()
    before = _everything(module)
    label = module.describe() if hasattr(module, 'describe') else type(module).__name__
    with pytest.raises(FoldError) as info:
        module.reparameterize()
    message = str(info.value)
    assert message.startswith(f'cannot fold {label}: ') and '\n' not in message
    assert 'training mode' in message and message.endswith('call model.eval() first')
    _assert_unchanged(module, before)
    module.eval()
    module.reparameterize()
    assert module.deploy is True
