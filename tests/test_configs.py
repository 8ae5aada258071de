"""Every config builds, and its model runs one loss step and one predict step on a small input."""
import copy
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import DefaultScope

import mmrepa

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))
H, W = 96, 128


def det_inputs(with_mask):
    from mmdet.testing import demo_mm_inputs
    return demo_mm_inputs(batch_size=2, image_shapes=[(3, H, W)] * 2, num_items=[2, 3],
                          num_classes=3, with_mask=with_mask)


def seg_inputs(num_classes):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, H, W)))
        samples.append(s)
    return dict(inputs=[torch.randint(0, 256, (3, H, W), dtype=torch.uint8)] * 2,
                data_samples=samples)


def shrink(cfg):
    """Test-time budget: small padding, few proposals. The architecture is untouched."""
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = (H, W)
    for key in ('train_cfg', 'test_cfg'):
        stage = cfg.model.get(key) or {}
        for name in ('rpn_proposal', 'rpn'):
            if isinstance(stage.get(name), dict) and 'nms_pre' in stage[name]:
                stage[name].update(nms_pre=100, max_per_img=50)
        rcnn = stage.get('rcnn')
        for r in (rcnn if isinstance(rcnn, list) else [rcnn]):
            if isinstance(r, dict) and 'sampler' in r:
                r.sampler.num = 32
            elif isinstance(r, dict) and 'max_per_img' in r:
                r.max_per_img = 20
    return cfg


def build(cfg):
    scope = cfg.default_scope
    registry = __import__(f'{scope}.registry', fromlist=['MODELS'])
    with DefaultScope.overwrite_default_scope(scope):
        return revert_sync_batchnorm(registry.MODELS.build(cfg.model))  # SyncBN needs a GPU


def test_every_config_is_covered():
    names = {osp.basename(c) for c in CONFIGS}
    for size in 'tsb':
        assert f'retinanet_repa_swin_{size}_1x_coco.py' in names
        assert f'retinanet_swin_{size}_1x_coco.py' in names
        assert f'upernet_repa_swin_{size}_512x512_160k_ade20k.py' in names
    assert len(CONFIGS) >= 25


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: osp.relpath(p, ROOT))
def test_config_builds_and_runs_loss_and_predict(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports.imports == ['mmrepa']
    backbone = cfg.model.backbone
    if backbone.get('init_cfg'):
        assert backbone.init_cfg.type == 'Pretrained'
    model = build(shrink(cfg))
    assert type(model.backbone).__module__.startswith('mmrepa.')
    if cfg.default_scope == 'mmseg':
        packed = seg_inputs(cfg.model.decode_head.num_classes)
    else:
        packed = det_inputs(with_mask='mask' in osp.basename(path))

    model.train()
    data = model.data_preprocessor(copy.deepcopy(packed), True)
    losses = model(**data, mode='loss')
    total = sum(v.sum() for k, v in losses.items() if 'loss' in k and torch.is_tensor(v)) + \
        sum(sum(x.sum() for x in v) for k, v in losses.items() if 'loss' in k and
            isinstance(v, list))
    assert torch.isfinite(total)
    total.backward()
    first = next(model.backbone.parameters())  # the patch embedding / stem: gradients reach it
    assert first.grad is not None

    model.eval()
    data = model.data_preprocessor(copy.deepcopy(packed), False)
    with torch.no_grad():
        preds = model(**data, mode='predict')
        assert len(preds) == 2
        # the folded backbone gives the same features, compared in float64: untrained RepBN
        # norms (PRepBN configs) do not normalise, and the resulting backbone is so
        # ill-conditioned that fp32 rounding alone moves its outputs by more than 1e-4
        backbone = copy.deepcopy(model.backbone).double()
        x = data['inputs'].double()
        feats = backbone(x)
        mmrepa.reparameterize(backbone)
        for a, b in zip(feats, backbone(x)):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6 * a.abs().max().item())
        # and the folded model still predicts
        model.backbone = backbone.float()
        mmrepa.reparameterize(model)
        assert len(model(**data, mode='predict')) == 2
