"""Pretrained loading, checked against independent implementations (mmdet, timm)."""

import copy
import logging
import re

import pytest
import torch
import torch.nn.functional as F
from mmengine.logging import MMLogger

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, RePaSwin
from mmrepa.backbones.swin.checkpoint import _unfold_order, checkpoint_filter_fn
from mmrepa.checkpoint import load_state_dict_checked
from tests.helpers import TINY_ARCH, max_abs_diff, randomize_

SWIN_KW = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def pretrained(tmp_path, state_dict, **kw):
    """A RePaSwin that loads ``state_dict`` from a file through ``init_cfg``, as configs do."""
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': state_dict}, path)
    kw.setdefault('drop_path_rate', 0.0)
    model = RePaSwin(arch=TINY_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    model.init_weights()
    return model.eval()


def test_mmdet_swin_checkpoint_gives_mmdet_outputs(tmp_path):
    from mmdet.models.backbones import SwinTransformer

    ref = randomize_(SwinTransformer(**SWIN_KW, drop_path_rate=0.0))
    ref.eval()  # mmdet's Swin.train() returns None
    detector_state = {'backbone.' + k: v for k, v in ref.state_dict().items()}
    detector_state['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)  # ignored: not backbone
    ours = pretrained(tmp_path, detector_state, idle_ratio=0.0, ffn_norm='LN')
    for hw in [(75, 101), (224, 224), (33, 47)]:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            assert max_abs_diff(ours(x), ref(x)) < 1e-5, hw


def _timm_to_original(state_dict):
    """timm moved Swin's patch merging to the start of the next stage; the release has it at
    the end of its own stage, and calls the classifier ``head``."""
    out = {}
    for k, v in state_dict.items():
        m = re.match(r'layers\.(\d+)\.downsample\.(.*)', k)
        if m:
            k = f'layers.{int(m.group(1)) - 1}.downsample.{m.group(2)}'
        out[k.replace('head.fc.', 'head.')] = v
    return out


def test_original_swin_checkpoint_gives_timm_outputs(tmp_path):
    timm = pytest.importorskip('timm')
    # At 448 px every stage map is larger than the window. (At 224 the last map is one window:
    # the original Swin then drops the shift, mmdet's Swin - and RePaSwin - keep it.)
    ref = timm.create_model(
        'swin_tiny_patch4_window7_224',
        pretrained=False,
        embed_dim=16,
        depths=(2, 2, 2, 2),
        num_heads=(1, 2, 2, 4),
        drop_path_rate=0.0,
        img_size=448,
    )
    ref = randomize_(ref).eval()
    ours = pretrained(tmp_path, _timm_to_original(ref.state_dict()), idle_ratio=0.0, ffn_norm='LN')
    x = torch.randn(2, 3, 448, 448)
    with torch.no_grad():
        final, inter = ref.forward_intermediates(x, indices=4, norm=True)
        raw = ref.forward_intermediates(x, indices=4, intermediates_only=True)
        outs = ours(x)
    for i in range(3):  # new output norms start as identity-affine LayerNorms
        expected = F.layer_norm(raw[i].permute(0, 2, 3, 1), raw[i].shape[1:2]).permute(0, 3, 1, 2)
        assert max_abs_diff(outs[i], expected) < 1e-4, i
    assert max_abs_diff(outs[3], inter[3]) < 1e-4  # the classifier's norm became norm3


def _to_repavit_layout(state_dict):
    out = {}
    for k, v in state_dict.items():
        k = k.replace('patch_embed.projection.', 'patch_embed.proj.')
        if k.startswith('stages.'):
            k = 'layers.' + k[len('stages.') :]
            k = k.replace('.attn.w_msa.', '.attn.').replace('.ffn.', '.mlp.')
            if '.downsample.' in k:  # unfold order (channel-major) back to concat order
                lead, C = v.shape[:-1], v.shape[-1] // 4
                v = v.reshape(*lead, C, 4).transpose(-1, -2)[..., [0, 2, 1, 3], :]
                v = v.reshape(*lead, 4 * C)
        out[k.replace('norm3.', 'norm.')] = v
    return out


def test_repavit_checkpoint_round_trip(tmp_path):
    src = randomize_(RePaSwin(arch=TINY_ARCH, drop_path_rate=0.0)).eval()
    state = _to_repavit_layout(src.state_dict())
    assert 'layers.0.blocks.1.mlp.norm2.running_var' in state
    ours = pretrained(tmp_path, state)
    x = torch.randn(1, 3, 90, 70)
    with torch.no_grad():
        assert max_abs_diff(ours(x)[3], src(x)[3]) < 1e-5


def test_unfold_order_matches_the_two_concatenations():
    # Swin: cat(x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]) along channels;
    # nn.Unfold(2, stride=2): channel-major, then (row, col) offsets in raster order.
    C = 3
    x = torch.randn(1, C, 4, 6)
    concat = (
        torch.cat(
            [x[..., 0::2, 0::2], x[..., 1::2, 0::2], x[..., 0::2, 1::2], x[..., 1::2, 1::2]], dim=1
        )
        .flatten(2)
        .transpose(1, 2)
    )
    unfold = torch.nn.functional.unfold(x, 2, stride=2).transpose(1, 2)
    w = torch.randn(5, 4 * C)
    torch.testing.assert_close(unfold @ _unfold_order(w).t(), concat @ w.t())


def test_missing_bn_statistics_are_an_error(tmp_path):
    state = randomize_(RePaSwin(arch=TINY_ARCH)).state_dict()
    del state['stages.1.blocks.0.ffn.norm2.running_var']
    with pytest.raises(KeyError, match=r'stages\.1\.blocks\.0\.ffn\.norm2\.running_var'):
        pretrained(tmp_path, state)


def test_vanilla_swin_into_repa_swin_is_an_error(tmp_path):
    # a LN-FFN checkpoint has no BatchNorm statistics for the BN-FFN model
    state = RePaSwin(arch=TINY_ARCH, idle_ratio=0, ffn_norm='LN').state_dict()
    with pytest.raises(KeyError, match='running_mean'):
        pretrained(tmp_path, state)


def test_another_arch_names_the_key_and_both_shapes(tmp_path):
    state = RePaSwin(arch=dict(TINY_ARCH, embed_dims=32)).state_dict()
    with pytest.raises(
        ValueError,
        match=r'patch_embed\.projection\.weight has shape '
        r'\(32, 3, 4, 4\) in the checkpoint but \(16, 3, 4, 4\)',
    ):
        pretrained(tmp_path, state)


def test_unused_and_missing_optional_keys_are_reported_by_name(tmp_path):
    state = RePaSwin(arch=TINY_ARCH).state_dict()
    del state['norm1.weight']
    state['head.fc.weight'] = torch.zeros(3)
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        pretrained(tmp_path, state)
    finally:
        logger.removeHandler(handler)
    log = '\n'.join(records)
    assert 'left as initialised: norm1.weight' in log
    assert 'not used by RePaSwin: head.fc.weight' in log


def test_folded_and_unfolded_checkpoints_need_the_matching_deploy_flag(tmp_path):
    model = RePaSwin(arch=TINY_ARCH).eval()
    with pytest.raises(
        ValueError,
        match=r'stages\.0\.blocks\.0\.ffn: .*unfolded weights.*'
        'Build it with deploy=False',
    ):
        pretrained(tmp_path, model.state_dict(), deploy=True)
    with pytest.raises(ValueError, match=r'ffn: .*folded weights.*Build it with deploy=True'):
        pretrained(tmp_path, reparameterize(model).state_dict())
    pretrained(tmp_path, model.state_dict(), deploy=True)  # folded into deploy: fine


def test_relative_position_tables_of_another_window_are_resized(tmp_path):
    state = RePaSwin(arch=TINY_ARCH, window_size=12).state_dict()
    model = RePaSwin(arch=TINY_ARCH, window_size=7)
    key = 'stages.0.blocks.0.attn.w_msa.relative_position_bias_table'
    # a bias that depends on the vertical offset only: so must the resized one (a transposed
    # reshape would make it depend on the horizontal offset only)
    dy = torch.arange(23.0).view(23, 1).expand(23, 23)
    state[key] = dy.reshape(529, 1)
    converted = checkpoint_filter_fn(state, model)
    assert converted[key].shape == model.state_dict()[key].shape == (169, 1)
    grid = converted[key].view(13, 13)
    assert torch.allclose(grid, grid[:, :1].expand(13, 13), atol=1e-5)
    assert (grid[1:, 0] > grid[:-1, 0]).all()
    torch.testing.assert_close(grid[6, 0], torch.tensor(11.0), atol=1e-4, rtol=0)  # offset 0
    load_state_dict_checked(model, converted)


@pytest.mark.parametrize(
    'build',
    [
        lambda deploy: RePaSwin(arch=TINY_ARCH, deploy=deploy),
        lambda deploy: CAFormer(
            arch=dict(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64)),
            head_dim=16,
            idle_ratio=0.5,
            deploy=deploy,
        ),
    ],
    ids=['repa_swin', 'repa_caformer'],
)
def test_runner_load_path_refuses_the_other_form(build, tmp_path):
    """``load_from``, resume and tools/test.py load with mmengine's non-strict
    ``load_checkpoint``: a folded/unfolded mismatch must stop it, not leave initial weights."""
    from mmengine.runner import load_checkpoint

    unfolded = randomize_(build(False)).eval()
    folded = reparameterize(copy.deepcopy(unfolded))
    for name, model in (('unfolded', unfolded), ('folded', folded)):
        torch.save(
            dict(state_dict={f'backbone.{k}': v for k, v in model.state_dict().items()}),
            str(tmp_path / f'{name}.pth'),
        )
    detector = torch.nn.Module()
    detector.backbone = build(False)
    with pytest.raises(ValueError, match='deploy=True'):
        load_checkpoint(detector, str(tmp_path / 'folded.pth'))
    detector.backbone = build(True)
    with pytest.raises(ValueError, match='deploy=False'):
        load_checkpoint(detector, str(tmp_path / 'unfolded.pth'))
    load_checkpoint(detector, str(tmp_path / 'folded.pth'))  # the matching form loads
    x = torch.randn(1, 3, 45, 61)
    with torch.no_grad():
        for a, b in zip(detector.backbone.eval()(x), unfolded(x)):
            assert (a - b).abs().max() < 1e-4


def test_runner_load_path_names_the_first_mismatched_key(tmp_path):
    from mmengine.runner import load_checkpoint

    other = RePaSwin(arch=dict(TINY_ARCH, embed_dims=24))
    torch.save(
        dict(state_dict={f'backbone.{k}': v for k, v in other.state_dict().items()}),
        str(tmp_path / 'other.pth'),
    )
    detector = torch.nn.Module()
    detector.backbone = RePaSwin(arch=TINY_ARCH)
    with pytest.raises(
        ValueError,
        match=r'backbone\.patch_embed\.projection\.weight has shape '
        r'\(24, 3, 4, 4\) in the checkpoint but \(16, 3, 4, 4\)',
    ):
        load_checkpoint(detector, str(tmp_path / 'other.pth'))
