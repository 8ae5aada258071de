"""PRepBN-PVT: mmdet's PVT at λ = 1, exact folding on awkward sizes, checkpoints, bad input."""

import pytest
import torch
import torch.nn as nn

from mmrepa import fold_model
from mmrepa.backbones import PRepBNPVT, PRepBNSwin
from mmrepa.engine.hooks import PRepBNScheduleHook
from mmrepa.errors import CheckpointError, ConfigError
from mmrepa.layers import PRepBN
from tests.helpers import TINY_ARCH, randomize_

# mmdet's argument names; 8 channels per head, stage widths 8, 16, 16, 32
KW = dict(embed_dims=8, num_layers=[1, 2, 1, 1], num_heads=[1, 2, 2, 4], pretrain_img_size=224)
SIZE = (2, 3, 75, 83)  # odd sides: every patch embedding and reduction drops a remainder


def mmdet_pvt(**kw):
    from mmdet.models.backbones import PyramidVisionTransformer

    torch.manual_seed(0)
    return randomize_(PyramidVisionTransformer(**KW, drop_path_rate=0.0, **kw)).double()


def ours(**kw):
    return PRepBNPVT(**KW, drop_path_rate=0.0, **kw).double()


def load(model, state_dict, tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': state_dict}, path)
    model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model.init_weights()
    return model


def rel_diff(a, b):
    return max(((u - v).abs().max() / u.abs().max()).item() for u, v in zip(a, b))


def to_release(ref):
    """mmdet's PVT state dict written back in the PVT release's names (the inverse of mmdet's
    ``pvt_convert``), plus a class token and head the converter must drop."""
    out = {'cls_token': torch.zeros(1, 1, 32), 'head.weight': torch.zeros(10, 32)}
    for i, (embed, layers, _) in enumerate(ref.layers):
        s = i + 1
        for k, v in embed.state_dict().items():
            out[f'patch_embed{s}.' + k.replace('projection.', 'proj.')] = v
        pos = layers[0].pos_embed
        out[f'pos_embed{s}'] = torch.cat([pos[:, :1], pos], 1) if s == 4 else pos
        for j, block in enumerate(layers[1:]):
            for k, v in block.state_dict().items():
                p = f'block{s}.{j}.'
                if 'in_proj_' in k:
                    leaf, C = k.rsplit('_', 1)[1], v.shape[0] // 3
                    out[p + 'attn.q.' + leaf], out[p + 'attn.kv.' + leaf] = v[:C], v[C:]
                elif 'out_proj' in k:
                    out[p + 'attn.proj.' + k.rsplit('.', 1)[1]] = v
                elif k.startswith('ffn.layers.'):
                    idx, leaf = k[len('ffn.layers.') :].split('.')
                    fc = 'fc1' if idx == '0' else 'fc2'
                    out[f'{p}mlp.{fc}.{leaf}'] = v.flatten(1) if v.dim() == 4 else v
                else:
                    out[p + k] = v
    return out


def test_lambda_one_is_mmdets_pvt_from_the_same_weights_in_any_layout(tmp_path):
    """mmdet format (also a whole detector's) and the PVT release format (read by mmdet's own
    pvt_convert into the reference) load through init_cfg; at λ = 1 in training mode every
    PRepBN is its LayerNorm and the backbone is mmdet's, to 1e-10 in float64."""
    from mmdet.models.backbones.pvt import pvt_convert

    ref = mmdet_pvt().train()
    x = torch.randn(SIZE, dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x)
        detector = {'backbone.' + k: v for k, v in ref.state_dict().items()}
        model = load(ours(), detector, tmp_path).train()
        assert rel_diff(expected, model(x)) < 1e-10
        release = to_release(ref)
        again = mmdet_pvt()
        again.load_state_dict(pvt_convert(release))
        model = load(ours(), release, tmp_path).train()
        assert rel_diff(again.train()(x), model(x)) < 1e-10
    assert torch.equal(
        model.stages[1].blocks[1].ffn.norm1.ln.weight, ref.layers[1][1][2].norm2.weight
    )


def test_prepbn_schedule_hook_drives_every_norm():
    model = ours()
    layers = PRepBNScheduleHook(decay_iters=10).find_layers(model)
    # per stage: patch embedding + per block norm1, FFN norm, and the reduction's norm (not in
    # the last stage, sr_ratio 1)
    assert len(layers) == 4 + 2 * 5 + 4
    assert not [
        k for k, m in model.named_modules() if isinstance(m, nn.LayerNorm) and '.ln' not in k
    ]


@pytest.mark.parametrize('paddings', [(0, 0, 0, 0), (1, 1, 0, 1)])
def test_fold_is_exact_and_leaves_no_norm(paddings, tmp_path):
    model = randomize_(ours(paddings=paddings, patch_sizes=(5, 3, 2, 2), idle_ratio=0.5)).eval()
    x = torch.randn(SIZE, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        fold_model(model, logger=None)
        after = model(x)
    assert rel_diff(before, after) < 1e-10
    assert not [m for m in model.modules() if isinstance(m, (PRepBN, nn.LayerNorm))]
    deployed = ours(paddings=paddings, patch_sizes=(5, 3, 2, 2), idle_ratio=0.5, deploy=True)
    detector = {'backbone.' + k: v for k, v in model.state_dict().items()}
    load(deployed, detector, tmp_path)  # the folded checkpoint of a whole detector
    with torch.no_grad():
        assert rel_diff(after, deployed.eval()(x)) == 0


def test_fold_is_close_in_float32():
    """PVT's init with random norms (all random weights make the residual stream ~1e7)."""
    model = ours().float()
    for m in model.modules():
        if isinstance(m, PRepBN):
            randomize_(m)
    x = torch.randn(SIZE)
    with torch.no_grad():
        before = model.eval()(x)
        fold_model(model, logger=None)
        assert rel_diff(before, model(x)) < 1e-5


def test_a_mmdet_pvt_config_switches_by_its_type_alone(tmp_path):
    from mmdet.registry import MODELS
    from mmengine.config import Config

    path = tmp_path / 'config.py'
    path.write_text(
        "_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'\n"
        "model = dict(backbone=dict(type='PRepBNPVT'))\n"
    )
    cfg = Config.fromfile(str(path)).model.backbone
    backbone = MODELS.build(cfg)
    assert [len(s.blocks) for s in backbone.stages] == [2, 2, 2, 2]
    assert backbone.num_features == [64, 128, 320, 512]
    assert backbone.init_cfg == dict(cfg.init_cfg, type='Pretrained')


def test_layernorm_checkpoint_of_another_size_or_family_is_refused(tmp_path):
    bigger = dict(KW, num_layers=[1, 3, 1, 1])
    with pytest.raises(CheckpointError, match=r'stages\.1\.blocks\.2\..*another size'):
        load(ours(), PRepBNPVT(**bigger).state_dict(), tmp_path)
    swin = PRepBNSwin(arch=TINY_ARCH, window_size=3).state_dict()
    with pytest.raises(CheckpointError, match='another size or family|lacks'):
        load(ours(), swin, tmp_path)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='huge'), r"unknown arch 'huge'; choose one of \['medium', 'small', 'tiny'\]"),
        (dict(norm_cfg=dict(type='BN')), r"norm_cfg=.*only norm_cfg=dict\(type='LN'"),
        (dict(use_conv_ffn=True), r'use_conv_ffn=True \(a PVTv2 option\)'),
        (dict(norm_after_stage=True), r'norm_after_stage=True \(a PVTv2 option\)'),
        (dict(arch='small', num_layers=[2, 2, 2, 2]), r"arch='small' has num_layers"),
        (dict(sr_ratios=(8, 4, 2)), r'sr_ratios has 3 entries'),
    ],
)
def test_bad_options_say_what_is_wrong_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        PRepBNPVT(**kwargs)
    assert '\n' not in str(info.value)
