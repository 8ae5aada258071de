"""ConvFormer and CAFormer: folds, timm parity, checkpoints, counts and options."""

import copy
import logging
import re

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import reparameterize
from mmrepa.backbones import (
    CAFormer,
    ConvFormer,
    IdentityFormer,
    PoolFormer,
    PoolFormerV2,
    RandFormer,
)
from mmrepa.backbones.metaformer import (
    ARCH_SETTINGS,
    POOLFORMER_ARCHS,
    RandomMixing,
    SquaredReLU,
    checkpoint_filter_fn,
)
from mmrepa.checkpoint import load_state_dict_checked
from mmrepa.errors import CheckpointError
from mmrepa.layers import ChannelIdleFFN
from tests.helpers import config_paths, max_abs_diff, naive_windowed_attention, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 backbone folds at 1e-4 ≈ 1680·u32 of each output's scale: u32 times the summed
# reduction lengths through the stages; observed ≤ 0.011 of it on both kernel settings.

timm = pytest.importorskip('timm')
from timm.models import metaformer as timm_mf  # noqa: E402

# Small but complete: four stages, two SepConv and two attention stages for CAFormer, res
# scales in stages 3-4, several blocks where it matters.
TINY = dict(depths=(1, 2, 2, 1), dims=(16, 32, 48, 64))
HEAD_DIM = 16
WINDOWS = (None, None, 3, 2)
# Not multiples of 32, nor of the windows: the stage maps 19x25 / 10x13 / 5x7 / 3x4 pad both
# window grids; at 33x47 the attention maps (2x3, 1x2) fit in one window.
SIZES = [(75, 101), (33, 47)]


def tiny(cls, dtype=torch.float64, **kw):
    if cls is CAFormer:
        kw.setdefault('window_size', WINDOWS)
        kw.setdefault('head_dim', HEAD_DIM)
    model = cls(arch=TINY, **kw)
    return randomize_(model).to(dtype).eval()


# timm's poolformer_s12 and poolformerv2_s12 (identityformer: v2 with identity mixers)
TIMM_POOLFORMER_V1 = dict(
    downsample_norm=None,
    mlp_act=nn.GELU,
    mlp_bias=True,
    norm_layers=timm_mf.GroupNorm1,
    layer_scale_init_values=1e-5,
    res_scale_init_values=None,
)
TIMM_POOLFORMER_V2 = dict(norm_layers=timm_mf.GroupNorm1NoBias)


def timm_tiny(cls):
    """timm's MetaFormer with the TINY arch, built like convformer_s18 / caformer_s18 /
    poolformer_s12 / poolformerv2_s12 (IdentityFormer: the latter with identity mixers)."""
    if cls is ConvFormer:
        kw = dict(token_mixers=[timm_mf.SepConv] * 4, norm_layers=timm_mf.LayerNorm2dNoBias)
    elif cls is PoolFormer:
        kw = dict(TIMM_POOLFORMER_V1, use_mlp_head=False)
    elif cls in (PoolFormerV2, IdentityFormer):
        mixer = timm_mf.Pooling if cls is PoolFormerV2 else nn.Identity
        kw = dict(TIMM_POOLFORMER_V2, token_mixers=mixer, use_mlp_head=False)
    else:
        kw = dict(
            token_mixers=[timm_mf.SepConv] * 2 + [timm_mf.Attention] * 2,
            norm_layers=[timm_mf.LayerNorm2dNoBias] * 2 + [timm_mf.LayerNormNoBias] * 2,
            head_dim=HEAD_DIM,
        )
    return timm_mf.MetaFormer(**TINY, **kw)


def with_output_norms(model, feats):
    """timm's stage outputs through our output norms, for comparison with our outputs."""
    return [
        getattr(model, f'norm{i}')(f.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        for i, f in enumerate(feats)
    ]


def load_timm(model, timm_model):
    return load_state_dict_checked(
        model, checkpoint_filter_fn(timm_model.state_dict(), model), may_be_missing=['norm[0-9]*']
    )


# ----------------------------------------------------------------------------- folding


NEW_FAMILIES = [PoolFormer, PoolFormerV2, IdentityFormer]


@pytest.mark.parametrize(
    'cls, hw, idle',
    [
        (cls, hw, idle)
        for cls in (ConvFormer, CAFormer)
        for hw in SIZES
        for idle in (0.0, [0.0, 0.5, 0.75, 1.0])
    ]
    # no windows to pad: one size; idle ratio 0 in stage 1, the published fold
    + [(cls, SIZES[0], [0.0, 0.5, 0.75, 1.0]) for cls in NEW_FAMILIES],
)
def test_fold_is_exact_in_float64(cls, hw, idle):
    model = tiny(cls, idle_ratio=idle)
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    ref = model(x)
    folded = reparameterize(copy.deepcopy(model))
    assert folded.deploy
    assert max_abs_diff(folded(x), ref) <= 1e-10


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer, PoolFormer])
def test_fold_is_close_in_float32(cls):
    model = tiny(cls, torch.float32, idle_ratio=0.75)
    x = torch.randn(1, 3, 75, 101)
    ref = model(x)
    out = reparameterize(copy.deepcopy(model))(x)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


def test_published_model_folds_star_relu_scales_into_the_following_layer():
    model = reparameterize(tiny(CAFormer, idle_ratio=0.0))
    for block in (model.stages[0].blocks[0], model.stages[2].blocks[0]):
        ffn = block.ffn
        assert isinstance(ffn, ChannelIdleFFN) and ffn.deploy
        assert type(ffn.act) is SquaredReLU and not list(ffn.act.parameters())
        assert isinstance(ffn.norm1, nn.LayerNorm)  # LayerNorm pre-norm: kept
        assert ffn.out_proj.bias is not None  # StarReLU's bias, through fc2
    sep = model.stages[0].blocks[0].token_mixer
    assert isinstance(sep.act1, SquaredReLU) and sep.act1.bias is not None
    assert model.stages[2].blocks[0].ffn.res_scale is not None  # stage 3: r2 kept for LN


def test_repa_fold_is_the_three_matrix_form():
    model = reparameterize(tiny(ConvFormer, idle_ratio=0.75))
    C = TINY['dims'][2]
    ffn = model.stages[2].blocks[1].ffn
    a = C  # ceil(4C * 0.25)
    assert tuple(ffn.in_proj.weight.shape) == (a + C, C)
    assert tuple(ffn.out_proj.weight.shape) == (C, a)
    assert ffn.norm1 is None and ffn.res_scale is None  # BN and diag(r) folded


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer, PoolFormer])
def test_deploy_round_trip_and_idempotence(cls):
    model = tiny(cls, idle_ratio=[0.0, 0.25, 0.75, 0.75])
    x = torch.randn(1, 3, 61, 90, dtype=torch.float64)
    ref = model(x)
    reparameterize(model)
    state = copy.deepcopy(model.state_dict())
    reparameterize(model)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    kw = dict(window_size=WINDOWS, head_dim=HEAD_DIM) if cls is CAFormer else {}
    deployed = cls(arch=TINY, idle_ratio=[0.0, 0.25, 0.75, 0.75], deploy=True, **kw)
    deployed.double().eval().load_state_dict(state)  # strict: same structure
    assert max_abs_diff(deployed(x), ref) <= 1e-10


def test_folding_refuses_training_mode():
    from mmrepa import FoldError

    with pytest.raises(FoldError, match='eval mode'):
        reparameterize(ConvFormer(arch=TINY, idle_ratio=0.75).train())


# ----------------------------------------------------------------------------- timm parity


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer] + NEW_FAMILIES)
def test_timm_state_dict_gives_timm_outputs_in_float64(cls):
    ref = randomize_(timm_tiny(cls)).double().eval()
    kw = dict(window_size=None, head_dim=HEAD_DIM) if cls is CAFormer else {}
    ours = cls(arch=TINY, **kw).double().eval()
    report = load_timm(ours, ref)
    assert report.missing == [f'norm{i}.{p}' for i in range(3) for p in ('weight', 'bias')]
    assert report.unexpected and all(k.startswith('head.fc.') for k in report.unexpected)
    assert torch.equal(ours.norm3.weight, ref.head.norm.weight)
    for hw in [(75, 101), (64, 64)]:
        x = torch.randn(2, 3, *hw, dtype=torch.float64)
        with torch.no_grad():
            feats = ref.forward_intermediates(x, intermediates_only=True)
            expected = with_output_norms(ours, feats)
            scale = max(e.abs().max().item() for e in expected)
            assert max_abs_diff(ours(x), expected) <= 1e-10 * scale, hw


def test_full_size_caformer_s18_matches_timm():
    ref = randomize_(timm.create_model('caformer_s18', pretrained=False)).eval()
    ours = CAFormer('s18', window_size=None).eval()
    load_timm(ours, ref)
    x = torch.randn(1, 3, 97, 131)
    with torch.no_grad():
        expected = with_output_norms(ours, ref.forward_intermediates(x, intermediates_only=True))
        for o, e in zip(ours(x), expected):
            torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())


def windowed_timm(ref, windows):
    """timm's model with its attention restricted to windows by a naive per-window loop."""
    hw = {}

    class Windowed(nn.Module):
        def __init__(self, attn, window):
            super().__init__()
            self.attn, self.window = attn, window

        def forward(self, x):  # timm's attention stages hand over (B, H*W, C)
            H, W = hw['shape']
            out = naive_windowed_attention(self.attn, x.view(x.shape[0], H, W, -1), self.window)
            return out.flatten(1, 2)

    for i, stage in enumerate(ref.stages):
        if isinstance(stage.blocks[0].token_mixer, timm_mf.Attention):
            stage.downsample.register_forward_hook(
                lambda m, i, out: hw.__setitem__('shape', out.shape[2:])
            )
            for block in stage.blocks:
                block.token_mixer = Windowed(block.token_mixer, windows[i])
    return ref


def test_windows_change_only_the_attention():
    ref = randomize_(timm_tiny(CAFormer)).double().eval()
    ours = CAFormer(arch=TINY, window_size=WINDOWS, head_dim=HEAD_DIM).double().eval()
    load_timm(ours, ref)
    x = torch.randn(2, 3, 75, 101, dtype=torch.float64)
    with torch.no_grad():
        out = ours(x)
        global_ref = with_output_norms(ours, ref.forward_intermediates(x, intermediates_only=True))
        # the SepConv stages are untouched; the attention stages differ from global attention
        assert max_abs_diff(out[:2], global_ref[:2]) <= 1e-10
        assert max_abs_diff(out[2:], global_ref[2:]) > 1e-3
        # and are exactly timm's model with its attention computed window by window
        windowed = windowed_timm(ref, WINDOWS)
        expected = with_output_norms(
            ours, windowed.forward_intermediates(x, intermediates_only=True)
        )
        assert max_abs_diff(out, expected) <= 1e-10


def test_global_blocks_attend_globally():
    model = CAFormer(
        arch=TINY,
        head_dim=HEAD_DIM,
        window_size=(None, None, 3, 2),
        global_blocks=((), (), (1,), ()),
    )
    windows = [[b.token_mixer.window_size for b in s.blocks] for s in model.stages[2:]]
    assert windows == [[3, None], [2]]


# ----------------------------------------------------------------------------- checkpoints


def to_original_release(timm_state):
    """timm's names -> the sail-sg/metaformer release (the inverse of timm's converter)."""
    out = {}
    for k, v in timm_state.items():
        k = re.sub(r'^stem\.conv\.', 'downsample_layers.0.conv.', k)
        k = re.sub(r'^stem\.norm\.', 'downsample_layers.0.post_norm.', k)
        k = re.sub(r'^stages\.(\d+)\.downsample\.norm\.', r'downsample_layers.\1.pre_norm.', k)
        k = re.sub(r'^stages\.(\d+)\.downsample\.conv\.', r'downsample_layers.\1.conv.', k)
        k = re.sub(r'^stages\.(\d+)\.blocks\.(\d+)\.', r'stages.\1.\2.', k)
        k = re.sub(r'^head\.norm\.', 'norm.', k)
        k = re.sub(r'^head\.fc\.', 'head.', k)
        if v.dim() == 4 and v.shape[2:] == (1, 1):
            v = v.flatten(1)  # the release uses Linear layers
        out[k] = v
    return out


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer, PoolFormerV2])
def test_original_release_checkpoint_loads_through_the_converter(cls, tmp_path):
    ref = randomize_(timm_tiny(cls)).eval()
    release = to_original_release(ref.state_dict())
    # the fixture is the release format: timm's own converter maps it back exactly
    back = timm_mf.checkpoint_filter_fn(release, ref)
    assert set(back) == set(ref.state_dict())
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    path = tmp_path / 'release.pth'
    torch.save({'model': release}, path)
    kw = dict(window_size=None, head_dim=HEAD_DIM) if cls is CAFormer else {}
    ours = cls(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    ours.init_weights()
    ours.eval()
    x = torch.randn(1, 3, 70, 52)
    with torch.no_grad():
        expected = with_output_norms(ours, ref.forward_intermediates(x, intermediates_only=True))
        assert max_abs_diff(ours(x), expected) < 1e-4


def test_timm_checkpoint_file_loads_and_reports_what_it_did_not_load(tmp_path):
    ref = randomize_(timm_tiny(ConvFormer))
    path = tmp_path / 'timm.pth'
    torch.save({'state_dict': {'backbone.' + k: v for k, v in ref.state_dict().items()}}, path)
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        model = ConvFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
        model.init_weights()
    finally:
        logger.removeHandler(handler)
    assert torch.equal(
        model.stages[1].blocks[0].mlp.fc1.weight, ref.stages[1].blocks[0].mlp.fc1.weight.flatten(1)
    )
    log = '\n'.join(records)
    assert 'left as initialised: norm0.weight' in log
    assert 'not used by ConvFormer: head.fc.fc1.weight' in log


def test_missing_core_weights_and_wrong_shapes_are_errors():
    ref = timm_tiny(ConvFormer)
    state = ref.state_dict()
    del state['stages.2.blocks.1.mlp.fc2.weight']
    model = ConvFormer(arch=TINY)
    with pytest.raises(KeyError, match=r'stages\.2\.blocks\.1\.mlp\.fc2\.weight'):
        load_state_dict_checked(model, checkpoint_filter_fn(state, model))
    wide = ConvFormer(arch=dict(depths=TINY['depths'], dims=(16, 32, 48, 96)))
    with pytest.raises(ValueError, match=r'stages\.3\.downsample\.conv\.weight has shape'):
        state = checkpoint_filter_fn(ref.state_dict(), wide, check_structure=False)
        load_state_dict_checked(wide, state)


def test_published_weights_cannot_silently_initialise_a_repa_model():
    repa = ConvFormer(arch=TINY, idle_ratio=0.75)
    with pytest.raises(KeyError, match='running_mean'):
        load_state_dict_checked(
            repa, checkpoint_filter_fn(timm_tiny(ConvFormer).state_dict(), repa)
        )


def test_folded_and_unfolded_checkpoints_need_the_matching_deploy():
    model = ConvFormer(arch=TINY, idle_ratio=0.5).eval()
    unfolded = model.state_dict()
    folded = reparameterize(model).state_dict()
    with pytest.raises(ValueError, match=r'blocks\.0: .*folded weights.*Build it with deploy=True'):
        load_state_dict_checked(ConvFormer(arch=TINY, idle_ratio=0.5), folded)
    with pytest.raises(ValueError, match=r'blocks\.0: .*built folded \(deploy=True\)'):
        load_state_dict_checked(ConvFormer(arch=TINY, idle_ratio=0.5, deploy=True), unfolded)


# The names mmrepa saved a block's MLP branch under before it was one ChannelIdleFFN ``mlp``:
# timm's while training, ``ffn`` once folded.
EARLIER_NAMES = (
    (r'\.mlp\.norm1\.', '.norm2.'),
    (r'\.mlp\.norm2\.', '.mlp.norm.'),
    (r'\.mlp\.res_scale$', '.res_scale2.scale'),
    (r'\.mlp\.layer_scale$', '.layer_scale2.scale'),
)


def earlier_layout(state, folded):
    if folded:
        return {re.sub(r'(blocks\.\d+)\.mlp\.', r'\1.ffn.', k): v for k, v in state.items()}
    for pattern, name in EARLIER_NAMES:
        state = {re.sub(pattern, name, k): v for k, v in state.items()}
    return state


@pytest.mark.parametrize('cls, idle', [(ConvFormer, 0.5), (CAFormer, 0.0), (PoolFormer, 0.5)])
@pytest.mark.parametrize('folded', [False, True])
def test_checkpoints_with_the_earlier_mlp_names_still_load(cls, idle, folded):
    model = tiny(cls, idle_ratio=idle)
    if folded:
        reparameterize(model)
    state = earlier_layout(model.state_dict(), folded)
    assert state.keys() != model.state_dict().keys()
    loaded = tiny(cls, idle_ratio=idle, deploy=folded)
    load_state_dict_checked(loaded, checkpoint_filter_fn(state, loaded))
    x = torch.randn(1, 3, 41, 53, dtype=torch.float64)
    assert max_abs_diff(loaded(x), model(x)) == 0


# ----------------------------------------------------------------------------- sizes, counts

# the MetaFormer baselines paper's Table V: parameters in millions, classifiers with timm's head
PAPER_PARAMS = {
    ('convformer', 's18'): 27,
    ('convformer', 's36'): 40,
    ('convformer', 'm36'): 57,
    ('convformer', 'b36'): 100,
    ('caformer', 's18'): 26,
    ('caformer', 's36'): 39,
    ('caformer', 'm36'): 56,
    ('caformer', 'b36'): 99,
}


def _params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('family, arch', sorted(PAPER_PARAMS))
def test_parameter_counts_match_timm_and_the_paper(family, arch):
    cls = ConvFormer if family == 'convformer' else CAFormer
    with torch.device('meta'):  # shapes only: instant even for B36
        ref = timm.create_model(f'{family}_{arch}', pretrained=False)
        ours = cls(arch, out_indices=(3,))  # norm3 plays timm's head.norm
    classifier = _params(ref.head.fc)  # timm's MLP head: fc1, norm, fc2
    assert _params(ours) + classifier == _params(ref)
    assert round((_params(ours) + classifier) / 1e6) == PAPER_PARAMS[family, arch]


def test_arch_table_is_the_paper_s():
    assert ARCH_SETTINGS['m36'] == dict(depths=(3, 12, 18, 3), dims=(96, 192, 384, 576))
    heads = [WindowedSelfAttentionHeads(a) for a in ('s18', 'm36', 'b36')]
    assert heads == [(10, 16), (12, 18), (16, 24)]


def WindowedSelfAttentionHeads(arch):
    with torch.device('meta'):
        model = CAFormer(arch)
    return tuple(model.stages[i].blocks[0].token_mixer.num_heads for i in (2, 3))


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
def test_outputs_are_nchw_at_strides_4_to_32_for_any_size(cls):
    model = tiny(cls, torch.float32, out_indices=(1, 3))
    outs = model(torch.randn(2, 3, 100, 130))
    # stem: floor((100 - 3) / 4) + 1 = 25, floor((130 - 3) / 4) + 1 = 32; then halved, rounding up
    assert [tuple(o.shape) for o in outs] == [(2, 32, 13, 16), (2, 64, 4, 4)]
    assert all(o.is_contiguous() for o in outs)
    assert not hasattr(model, 'norm0') and hasattr(model, 'norm1')
    assert [o.shape[2:] for o in model(torch.randn(1, 3, 3, 5))] == [(1, 1), (1, 1)]


def test_norm_eval_freezes_batchnorm_statistics_only():
    model = ConvFormer(arch=TINY, idle_ratio=0.75, norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert bns and all(not m.training for m in bns)
    before = [m.running_mean.clone() for m in bns]
    model(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(b, m.running_mean) for b, m in zip(before, bns))
    assert model.stages[0].blocks[0].training
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(
        ConvFormer(arch=TINY, idle_ratio=0.75, norm_eval=True)
    ).train()
    assert all(not m.training for m in synced.modules() if isinstance(m, nn.SyncBatchNorm))


def test_frozen_stages():
    model = CAFormer(arch=TINY, head_dim=HEAD_DIM, frozen_stages=2).train()
    for m in (model.stem, model.stages[0], model.stages[1], model.norm0, model.norm1):
        assert not m.training and all(not p.requires_grad for p in m.parameters())
    for m in (model.stages[2], model.norm2):
        assert m.training and all(p.requires_grad for p in m.parameters())


def test_with_cp_gives_the_same_gradients():
    plain = CAFormer(arch=TINY, head_dim=HEAD_DIM, idle_ratio=0.5).train()
    ckpt = CAFormer(arch=TINY, head_dim=HEAD_DIM, idle_ratio=0.5, with_cp=True).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 80)
    for m in (plain, ckpt):
        sum(o.sum() for o in m(x)).backward()
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_init_weights_follow_timm():
    model = ConvFormer(arch=TINY, idle_ratio=0.5)
    model.init_weights()
    fc1 = model.stages[0].blocks[0].mlp.fc1.weight
    assert 0.015 < fc1.std().item() < 0.025  # trunc_normal(std=.02), as timm
    assert torch.equal(model.stem.conv.bias, torch.zeros_like(model.stem.conv.bias))
    act = model.stages[0].blocks[0].mlp.act
    assert act.scale.item() == 1.0 and act.bias.item() == 0.0


@pytest.mark.parametrize(
    'cls, kwargs, message',
    [
        (ConvFormer, dict(arch='t18'), r"unknown arch 't18'"),
        (
            ConvFormer,
            dict(arch=dict(depths=(1, 1, 1), dims=(8, 8, 8))),
            'needs 4 depths and 4 dims',
        ),
        (ConvFormer, dict(idle_ratio=1.5), r'idle_ratio must be in \[0, 1\]'),
        (PoolFormer, dict(idle_ratio=-0.25), r'idle_ratio must be in \[0, 1\]'),
        (RandFormer, dict(idle_ratio=[0, 0, 0, 2]), r'idle_ratio must be in \[0, 1\]'),
        (
            PoolFormerV2,
            dict(arch='s18'),
            r"unknown arch 's18'; choose one of \['m36', 'm48', 's12', 's24', 's36'\]",
        ),
        (IdentityFormer, dict(window_sizes=(7,) * 4), 'IdentityFormer has no'),
        (PoolFormer, dict(head_dim=16), 'PoolFormer has no'),
        (RandFormer, dict(img_size=(224,)), r'img_size must be an integer or \(H, W\)'),
        (ConvFormer, dict(idle_ratio=[0.5, 0.5]), 'idle_ratio has 2 entries but the arch has 4'),
        (ConvFormer, dict(out_indices=(4,)), r'out_indices .* \[0, 3\]'),
        (ConvFormer, dict(frozen_stages=5), r'frozen_stages must be in \[-1, 4\]'),
        (CAFormer, dict(window_size=0), 'window_size must be None .* or an integer >= 1'),
        (CAFormer, dict(window_size=(7, None, 14, 7)), 'stage 1 has no attention'),
        (CAFormer, dict(global_blocks=((), (), (9,), ())), 'block 9 does not exist in stage 3'),
        (CAFormer, dict(global_blocks=((0,), (), (), ())), 'stage 1 has no attention'),
        (CAFormer, dict(global_blocks=(1, 2)), 'global_blocks must give a sequence'),
    ],
)
def test_bad_options_say_what_is_wrong(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_bad_input_says_what_is_expected():
    model = ConvFormer(arch=TINY).eval()
    with pytest.raises(ValueError, match=r'expects input \(B, 3, H, W\)'):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match='at least 3 x 3 pixels'):
        model(torch.randn(1, 3, 2, 64))


# ------------------------------------------- PoolFormer (v1, v2), IdentityFormer, RandFormer


def mmpretrain_tiny():
    """mmpretrain's PoolFormer with the TINY arch, all four outputs, random weights."""
    from mmpretrain.models.backbones import PoolFormer as MMPoolFormer

    arch = dict(layers=list(TINY['depths']), embed_dims=list(TINY['dims']))
    model = MMPoolFormer(arch, out_indices=[0, 2, 4, 6])
    randomize_(model)
    model.double()
    model.eval()  # mmpretrain's PoolFormer.train returns None
    return model


def relative_diff(out, expected):
    return max_abs_diff(out, expected) / max(e.abs().max().item() for e in expected)


def test_mmpretrain_poolformer_gives_the_same_outputs_in_float64():
    ref = mmpretrain_tiny()
    ours = PoolFormer(arch=TINY).double().eval()
    report = load_state_dict_checked(ours, checkpoint_filter_fn(ref.state_dict(), ours))
    assert report.missing == [] and report.unexpected == []
    x = torch.randn(2, 3, 75, 101, dtype=torch.float64)
    with torch.no_grad():
        assert relative_diff(ours(x), ref(x)) <= 1e-10


def to_poolformer_release(mmpretrain_state):
    """mmpretrain's names -> the sail-sg/poolformer classifier release: no output norms but
    the classifier's ``norm`` (mmpretrain's last one) and ``head``."""
    out = {k: v for k, v in mmpretrain_state.items() if not re.match(r'norm\d', k)}
    out['norm.weight'], out['norm.bias'] = (
        mmpretrain_state['norm6.weight'],
        mmpretrain_state['norm6.bias'],
    )
    out['head.weight'], out['head.bias'] = torch.randn(1000, TINY['dims'][3]), torch.zeros(1000)
    return out


def test_poolformer_release_mmpretrain_and_detector_files_load_through_init_cfg(tmp_path):
    ref = mmpretrain_tiny()
    release = to_poolformer_release(ref.state_dict())
    # the fixture is the release format: timm's own converter maps it onto timm's names
    timm_ref = timm_tiny(PoolFormer)
    assert set(timm_mf.checkpoint_filter_fn(release, timm_ref)) == set(timm_ref.state_dict())
    own = PoolFormer(arch=TINY).double()
    load_state_dict_checked(own, checkpoint_filter_fn(ref.state_dict(), own))
    files = {
        'release': {'model': release},
        'mmpretrain_classifier': {
            'state_dict': {'backbone.' + k: v for k, v in ref.state_dict().items()}
            | {'head.fc.weight': torch.zeros(10, TINY['dims'][3])}
        },
        'mmrepa_detector': {
            'state_dict': {'backbone.' + k: v for k, v in own.state_dict().items()}
            | {'neck.lateral_convs.0.conv.weight': torch.zeros(8, 16, 1, 1)}
        },
    }
    x = torch.randn(1, 3, 70, 52, dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x)
    for name, content in files.items():
        path = tmp_path / f'{name}.pth'
        torch.save(content, path)
        ours = PoolFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
        ours.init_weights()
        ours.double().eval()
        with torch.no_grad():
            out = ours(x)
        # the release has the last output norm only (its classifier's)
        compared = slice(3, 4) if name == 'release' else slice(0, 4)
        assert relative_diff(out[compared], expected[compared]) <= 1e-10, name


@pytest.mark.parametrize(
    'timm_name, cls',
    [
        ('poolformer_s12', PoolFormer),
        ('poolformerv2_s12', PoolFormerV2),
    ],
)
def test_full_size_timm_poolformer_state_dicts_map_onto_ours(timm_name, cls):
    with torch.device('meta'):  # shapes only
        ref = timm.create_model(timm_name, pretrained=False)
        ours = cls(timm_name.split('_')[1])
    state = checkpoint_filter_fn(ref.state_dict(), ours)
    own = ours.state_dict()
    assert {k: v.shape for k, v in state.items() if k in own} == {
        k: v.shape for k, v in own.items() if not re.match(r'norm[0-2]\.', k)
    }
    assert sorted(set(state) - set(own)) == ['head.fc.bias', 'head.fc.weight']


# parameters in millions with a Linear classifier on the normalised pooled features: the
# MetaFormer baselines paper (Table III), the PoolFormer paper (v1; RePaFormer's Table 2)
PAPER_POOLFORMER_PARAMS = {
    'PoolFormerV2': dict(s12=11.9, s24=21.3, s36=30.8, m36=56.1, m48=73.3),
    'PoolFormer': dict(s12=12.0, s24=21.4, s36=30.9, m36=56, m48=73),
}
# RandFormer's frozen random matrices, "+ 0.2" etc. (Table III)
PAPER_RANDOM_PARAMS = dict(s12=0.2, s24=0.5, s36=0.7, m36=0.7, m48=0.9)


def test_poolformer_arch_table_is_the_papers():
    assert POOLFORMER_ARCHS['s36'] == dict(depths=(6, 6, 18, 6), dims=(64, 128, 320, 512))
    assert POOLFORMER_ARCHS['m48'] == dict(depths=(8, 8, 24, 8), dims=(96, 192, 384, 768))


@pytest.mark.parametrize('arch', ['s12'])  # the others: docs/backbones/metaformer.md
def test_poolformer_family_parameter_counts_are_the_papers(arch):
    with torch.device('meta'):
        models = {
            cls: cls(arch, out_indices=(3,))
            for cls in (PoolFormer, PoolFormerV2, IdentityFormer, RandFormer)
        }
    classifier = POOLFORMER_ARCHS[arch]['dims'][3] * 1001
    counts = {cls: (_params(m) + classifier) / 1e6 for cls, m in models.items()}
    for cls in (PoolFormer, PoolFormerV2):
        paper = PAPER_POOLFORMER_PARAMS[cls.__name__][arch]
        assert round(counts[cls], 1 if paper % 1 else 0) == paper, cls
    assert counts[IdentityFormer] == counts[PoolFormerV2]
    assert round(counts[RandFormer] - counts[IdentityFormer], 1) == PAPER_RANDOM_PARAMS[arch]


def test_random_mixing_is_the_paper_s_algorithm():
    layer = RandomMixing((3, 5)).double()
    assert not layer.random_matrix.requires_grad
    # the row softmax is taken in float32 (then made float64): each of its 15 entries is off,
    # relatively, by the float32 sum of 15 exponentials (γ_14 ≈ 14·u32) plus exp's and the
    # division's ulps, so a row sums to 1 within (15 + 4)·2^-24 (the float64 sum adds 15·2^-53);
    # torch's default float64 tolerance (2e-7, 3.4 u32) was under that bound
    n = 15
    torch.testing.assert_close(
        layer.random_matrix.sum(1),
        torch.ones(n, dtype=torch.float64),
        rtol=0,
        atol=(n + 4) * 2**-24,
    )
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    tokens = x.reshape(2, 15, 4)  # Algorithm 1 of the paper
    expected = torch.einsum('mn, bnc -> bmc', layer.random_matrix, tokens).reshape(x.shape)
    assert max_abs_diff(layer(x), expected) <= 1e-12


def test_randformer_with_identity_matrices_is_identityformer():
    rand = randomize_(RandFormer(arch=TINY, img_size=(61, 90))).double().eval()
    ident = IdentityFormer(arch=TINY).double().eval()
    shared = {k: v for k, v in rand.state_dict().items() if not k.endswith('random_matrix')}
    ident.load_state_dict(shared)  # strict: all but the random matrices
    x = torch.randn(2, 3, 61, 90, dtype=torch.float64)
    with torch.no_grad():
        assert max_abs_diff(rand(x), ident(x)) > 1e-3
        for m in rand.modules():
            if isinstance(m, RandomMixing):
                m.random_matrix.copy_(torch.eye(m.random_matrix.shape[0]))
        assert max_abs_diff(rand(x), ident(x)) <= 1e-12


@pytest.mark.parametrize('idle', [0.0, [0.0, 0.5, 0.75, 1.0]])
def test_randformer_fold_is_exact_in_float64_and_deploys(idle):
    model = randomize_(RandFormer(arch=TINY, img_size=(61, 90), idle_ratio=idle)).double().eval()
    x = torch.randn(2, 3, 61, 90, dtype=torch.float64)
    ref = model(x)
    reparameterize(model)
    assert max_abs_diff(model(x), ref) <= 1e-10
    deployed = RandFormer(arch=TINY, img_size=(61, 90), idle_ratio=idle, deploy=True)
    deployed.double().eval().load_state_dict(model.state_dict())  # strict
    assert max_abs_diff(deployed(x), ref) <= 1e-10


def test_randformer_refuses_another_input_size_in_one_line():
    model = RandFormer(arch=TINY, img_size=64).eval()
    with pytest.raises(ValueError) as info:
        model(torch.randn(1, 3, 800, 1216))
    message = str(info.value)
    assert '\n' not in message and 'made for 64 x 64 input and got (800, 1216)' in message
    assert [o.shape[2:] for o in model(torch.randn(1, 3, 64, 64))][2:] == [(4, 4), (2, 2)]


@pytest.mark.parametrize(
    'source, target, message',
    [
        (
            lambda: ConvFormer('s18'),
            lambda: PoolFormerV2('s12'),
            'the checkpoint is a ConvFormer s18, the model a PoolFormerV2 or IdentityFormer s12',
        ),
        (
            lambda: PoolFormer('s24'),
            lambda: PoolFormer('s12'),
            r'is a PoolFormer \(v1\) s24, the model a PoolFormer \(v1\) s12',
        ),
        (
            lambda: PoolFormerV2('m36'),
            lambda: PoolFormer('m36'),
            r'is a PoolFormerV2 or IdentityFormer m36, the model a PoolFormer \(v1\) m36',
        ),
        (lambda: PoolFormerV2('s12'), lambda: RandFormer('s12'), 'the model a RandFormer s12'),
        (lambda: nn.Linear(2, 2), lambda: IdentityFormer('s12'), 'has no MetaFormer blocks'),
    ],
)
def test_checkpoint_of_another_family_or_size_is_refused_in_one_line(source, target, message):
    with torch.device('meta'):  # shapes are all the check reads
        state, model = source().state_dict(), target()
    with pytest.raises(CheckpointError) as info:
        model.filter_checkpoint(state)
    assert re.search(message, str(info.value)) and '\n' not in str(info.value)


def test_init_cfg_refuses_a_checkpoint_of_another_size(tmp_path):
    path = tmp_path / 'other.pth'
    other = PoolFormer(arch=dict(depths=(1, 1, 2, 1), dims=TINY['dims']))
    torch.save({'state_dict': {'backbone.' + k: v for k, v in other.state_dict().items()}}, path)
    model = PoolFormer(arch=TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(CheckpointError, match=r'with depths \(1, 1, 2, 1\) and dims'):
        model.init_weights()


# --------------------------------------------------------------------------------- configs


def test_the_issue_configs_exist():
    import os.path as osp

    names = {osp.basename(c) for c in config_paths()}
    expected = []
    for fam in ('convformer', 'caformer'):
        expected += [
            f'mask-rcnn_{fam}_s18_ms-3x_coco.py',
            f'retinanet_{fam}_s18_1x_coco.py',
            f'mask-rcnn_repa_{fam}_s18_ms-3x_coco.py',
            f'retinanet_repa_{fam}_s18_1x_coco.py',
        ]
        for arch in ('s18', 's36', 'm36'):
            expected += [
                f'cascade-mask-rcnn_{fam}_{arch}_ms-3x_coco.py',
                f'upernet_{fam}_{arch}_512x512_160k_ade20k.py',
            ]
        for arch in ('s18', 'm36'):
            expected += [
                f'cascade-mask-rcnn_repa_{fam}_{arch}_ms-3x_coco.py',
                f'upernet_repa_{fam}_{arch}_512x512_160k_ade20k.py',
            ]
    for fam in ('poolformer', 'poolformerv2', 'identityformer', 'randformer'):
        expected += [f'{fam}_{arch}_32xb128_in1k.py' for arch in POOLFORMER_ARCHS]
    for arch in ('s12', 's24', 's36'):  # RePaFormer's Table 1
        expected += [
            f'repa_poolformer_{arch}_32xb128_in1k.py',
            f'repa_poolformer_{arch}_deploy_in1k.py',
        ]
    expected += [
        'retinanet_poolformer_s12_1x_coco.py',
        'mask-rcnn_poolformer_s12_1x_coco.py',
        'upernet_poolformer_s12_512x512_160k_ade20k.py',
    ]
    assert sorted(set(expected) - names) == []
