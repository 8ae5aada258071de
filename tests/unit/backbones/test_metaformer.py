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
from mmrepa.backbones import CAFormer, ConvFormer
from mmrepa.backbones.metaformer import ARCH_SETTINGS, checkpoint_filter_fn
from mmrepa.checkpoint import load_state_dict_checked
from mmrepa.layers import ChannelIdleFFN, SquaredReLU
from tests.helpers import config_paths, max_abs_diff, naive_windowed_attention, randomize_

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


def timm_tiny(cls):
    """timm's MetaFormer with the TINY arch, built like convformer_s18 / caformer_s18."""
    if cls is ConvFormer:
        kw = dict(token_mixers=[timm_mf.SepConv] * 4, norm_layers=timm_mf.LayerNorm2dNoBias)
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


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
@pytest.mark.parametrize('hw', SIZES)
@pytest.mark.parametrize('idle', [0.0, [0.0, 0.5, 0.75, 1.0]])
def test_fold_is_exact_in_float64(cls, hw, idle):
    model = tiny(cls, idle_ratio=idle)
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    ref = model(x)
    folded = reparameterize(copy.deepcopy(model))
    assert folded.deploy
    assert max_abs_diff(folded(x), ref) <= 1e-10


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
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


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
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


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
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
            assert max_abs_diff(ours(x), with_output_norms(ours, feats)) <= 1e-10, hw


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


@pytest.mark.parametrize('cls', [ConvFormer, CAFormer])
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


# ----------------------------------------------------------------------------- sizes, counts

# SPEC §4 / the paper: parameters in millions, classification models with timm's head
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
    assert sorted(set(expected) - names) == []
