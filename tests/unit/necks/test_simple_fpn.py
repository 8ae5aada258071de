"""SimpleFPN (ViTDet's simple feature pyramid) and the LN2d norm it uses."""

import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import DefaultScope

import mmrepa  # noqa: F401  (registers)
from mmrepa.layers import LayerNorm2d
from mmrepa.necks import SimpleFPN


def _sizes(outs):
    return [tuple(o.shape[2:]) for o in outs]


@pytest.mark.parametrize(
    'hw, expected',
    [
        ((16, 24), [(64, 96), (32, 48), (16, 24), (8, 12), (4, 6)]),
        ((13, 21), [(52, 84), (26, 42), (13, 21), (6, 10), (3, 5)]),  # odd: floor, then ceil
    ],
)
def test_output_levels_channels_and_sizes(hw, expected):
    neck = SimpleFPN(in_channels=32, out_channels=16, num_outs=5)
    outs = neck((torch.randn(2, 8, 99, 99), torch.randn(2, 32, *hw)))  # uses the last map
    assert isinstance(outs, tuple) and len(outs) == 5
    assert all(o.shape[:2] == (2, 16) for o in outs)
    assert _sizes(outs) == expected
    # The extra level subsamples the last one (kernel 1, stride 2), as mmdet's FPN does.
    torch.testing.assert_close(outs[4], outs[3][..., ::2, ::2])

    neck4 = SimpleFPN(in_channels=32, out_channels=16, num_outs=4)
    assert _sizes(neck4(torch.randn(1, 32, *hw))) == expected[:4]  # a bare tensor works too


def test_tensor_and_sequence_inputs_agree():
    neck = SimpleFPN(in_channels=16, out_channels=8).eval()
    x = torch.randn(1, 16, 5, 7)
    for a, b in zip(neck(x), neck([x])):
        torch.testing.assert_close(a, b)


def test_custom_scale_factors_subset():
    neck = SimpleFPN(in_channels=32, out_channels=16, num_outs=4, scale_factors=(2, 1.0, 0.5))
    assert neck.scale_factors == (2.0, 1.0, 0.5)
    assert len(neck.stages) == 3
    outs = neck(torch.randn(1, 32, 13, 21))
    assert _sizes(outs) == [(26, 42), (13, 21), (6, 10), (3, 5)]
    assert [o.shape[1] for o in outs] == [16] * 4
    # Only the levels asked for: 2x -> C/2 into its 1x1 conv, 1x and 0.5x -> C.
    assert [m.conv.in_channels for m in neck.lateral_convs] == [16, 32, 32]


def test_structure_follows_vitdet():
    neck = SimpleFPN(in_channels=32, out_channels=16)
    up4 = neck.stages[0]
    assert [type(m).__name__ for m in up4] == [
        'ConvTranspose2d',
        'LayerNorm2d',
        'GELU',
        'ConvTranspose2d',
    ]
    assert (up4[0].in_channels, up4[0].out_channels, up4[3].out_channels) == (32, 16, 8)
    assert up4[0].kernel_size == (2, 2) and up4[0].stride == (2, 2)
    assert type(neck.stages[1]).__name__ == 'ConvTranspose2d'
    assert type(neck.stages[2]).__name__ == 'Identity'
    assert type(neck.stages[3]).__name__ == 'MaxPool2d'
    for lateral, fpn in zip(neck.lateral_convs, neck.fpn_convs):
        assert lateral.conv.kernel_size == (1, 1) and fpn.conv.kernel_size == (3, 3)
        assert fpn.conv.padding == (1, 1)
        assert lateral.conv.bias is None and fpn.conv.bias is None
        assert isinstance(lateral.norm, LayerNorm2d) and isinstance(fpn.norm, LayerNorm2d)
        assert lateral.norm.eps == 1e-6
        assert not lateral.with_activation


@pytest.mark.parametrize(
    'norm_cfg, norm_type',
    [
        (dict(type='mmrepa.LN2d'), LayerNorm2d),
        (dict(type='GN', num_groups=4), torch.nn.GroupNorm),
        (None, None),
    ],
)
def test_other_norms(norm_cfg, norm_type):
    neck = SimpleFPN(in_channels=16, out_channels=8, norm_cfg=norm_cfg, act_cfg=dict(type='ReLU'))
    if norm_type is None:
        assert neck.lateral_convs[0].norm is None and neck.lateral_convs[0].conv.bias is not None
        assert len(neck.stages[0]) == 3  # deconv, GELU, deconv
    else:
        assert isinstance(neck.fpn_convs[0].norm, norm_type)
        assert isinstance(neck.stages[0][1], norm_type)
    assert neck.fpn_convs[0].with_activation
    assert len(neck(torch.randn(1, 16, 4, 4))) == 5


def test_gradients_reach_every_parameter():
    neck = SimpleFPN(in_channels=16, out_channels=8, num_outs=5)
    outs = neck(torch.randn(2, 16, 6, 5))
    # A random projection: the plain sum of a LayerNorm's output has no gradient upstream.
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    for name, p in neck.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_ln2d_normalizes_over_channels():
    from mmengine.registry import MODELS as ROOT

    from mmrepa.registry import MODELS as OWN

    assert OWN.get('LN2d') is LayerNorm2d
    assert 'LN2d' not in ROOT.module_dict  # a generic name: kept out of the root registry
    norm = LayerNorm2d(6, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, 6, 3, 5) * 3 + 1
    ref = F.layer_norm(x.permute(0, 2, 3, 1), (6,), norm.weight, norm.bias, 1e-6)
    torch.testing.assert_close(norm(x), ref.permute(0, 3, 1, 2))
    # Each position's channel vector is standardised (with unit weight and zero bias).
    y = LayerNorm2d(6)(x)
    torch.testing.assert_close(y.mean(1), torch.zeros(2, 3, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(1, unbiased=False), torch.ones(2, 3, 5), atol=1e-4, rtol=0)
    assert set(norm.state_dict()) == {'weight', 'bias'}
    with pytest.raises(ValueError, match=r'\(B, 6, \.\.\.\).*\(2, 3, 5, 6\)'):
        norm(x.permute(0, 2, 3, 1))


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_builds_from_downstream_scope_by_name(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        neck = registry.MODELS.build(
            dict(type='SimpleFPN', in_channels=16, out_channels=8, num_outs=4)
        )
    assert isinstance(neck, SimpleFPN)
    assert isinstance(neck.fpn_convs[0].norm, LayerNorm2d)
    assert _sizes(neck((torch.randn(1, 16, 4, 6),))) == [(16, 24), (8, 12), (4, 6), (2, 3)]


def test_in_mmdet_retinanet_loss(tmp_path):
    """custom_imports + a RetinaNet whose backbone gives one stride-16 map; loss and backward."""
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmengine.config import Config
    from mmengine.structures import InstanceData

    path = tmp_path / 'retinanet_simple_fpn.py'
    path.write_text(
        "_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'\n"
        "custom_imports = dict(imports=['mmrepa'])\n"
        'model = dict(\n'
        "    backbone=dict(_delete_=True, type='ResNet', depth=18, base_channels=16,\n"
        '                  num_stages=3, strides=(1, 2, 2), dilations=(1, 1, 1),\n'
        "                  out_indices=(2, ), norm_cfg=dict(type='BN'), init_cfg=None),\n"
        "    neck=dict(_delete_=True, type='SimpleFPN', in_channels=64, out_channels=32,\n"
        '              num_outs=5),\n'
        '    bbox_head=dict(in_channels=32, feat_channels=32, stacked_convs=1,\n'
        '                   anchor_generator=dict(strides=[4, 8, 16, 32, 64])))\n'
    )
    cfg = Config.fromfile(str(path))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    assert isinstance(model.neck, SimpleFPN)
    inputs = torch.randn(2, 3, 64, 96)
    feats = model.extract_feat(inputs)
    assert [tuple(f.shape) for f in feats] == [
        (2, 32, 16, 24),
        (2, 32, 8, 12),
        (2, 32, 4, 6),
        (2, 32, 2, 3),
        (2, 32, 1, 2),
    ]
    samples = []
    for _ in range(2):
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(64, 96), pad_shape=(64, 96), ori_shape=(64, 96), scale_factor=(1.0, 1.0)
            )
        )
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[4.0, 6.0, 40.0, 50.0]]), labels=torch.tensor([3])
        )
        samples.append(sample)
    losses = model.loss(inputs, samples)
    total = sum(sum(v) if isinstance(v, list) else v for v in losses.values())
    assert torch.isfinite(total)
    total.backward()
    assert all(p.grad is not None for p in model.neck.parameters())


def test_channel_mismatch_names_the_option():
    neck = SimpleFPN(in_channels=32, out_channels=16)
    with pytest.raises(ValueError, match=r'\(B, 32, H, W\).*\(1, 48, 4, 4\).*in_channels'):
        neck((torch.randn(1, 32, 8, 8), torch.randn(1, 48, 4, 4)))
    with pytest.raises(ValueError, match='in_channels'):
        neck(torch.randn(32, 4, 4))  # no batch dimension
    with pytest.raises(TypeError, match='non-empty'):
        neck(())


@pytest.mark.parametrize(
    'factors, match',
    [
        ((4.0, 3.0, 1.0), r'\[3\.0\] not supported.*\(4\.0, 2\.0, 1\.0, 0\.5\)'),
        ((0.25,), r'\[0\.25\] not supported'),
        ((1.0, 2.0), 'decreasing order'),
        ((2.0, 2.0), 'distinct'),
        ((), 'non-empty'),
    ],
)
def test_bad_scale_factors(factors, match):
    with pytest.raises(ValueError, match=match):
        SimpleFPN(in_channels=32, scale_factors=factors, num_outs=4)


def test_num_outs_too_small():
    with pytest.raises(ValueError, match=r'num_outs=3 .*4 levels'):
        SimpleFPN(in_channels=32, num_outs=3)
    SimpleFPN(in_channels=32, num_outs=3, scale_factors=(2.0, 1.0, 0.5))  # fits


def test_channels_must_divide():
    with pytest.raises(ValueError, match=r'scale factor 4 .*in_channels=30 is not divisible by 4'):
        SimpleFPN(in_channels=30)
    with pytest.raises(ValueError, match=r'scale factor 2 .*in_channels=31 .*by 2'):
        SimpleFPN(in_channels=31, scale_factors=(2.0, 1.0), num_outs=2)
    SimpleFPN(in_channels=30, scale_factors=(2.0, 1.0, 0.5), num_outs=3)  # no 4x level: fine
    with pytest.raises(TypeError, match='positive int'):
        SimpleFPN(in_channels=[32])
