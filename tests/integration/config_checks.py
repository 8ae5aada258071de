"""What the test_configs_<group>.py files check of every config: it builds, and its model runs
one loss step and one predict step on a small input. The configs are split by folder into groups,
one file each, so that ``--dist loadfile`` spreads them over the workers.

One config per backbone family runs at full size; the others run with their backbone shrunk to a
tiny arch of the same type (every other option, the neck and the heads as configured), after
their full-size backbone is built and checked against the channels the neck or heads expect.
"""

import copy
import glob
import os.path as osp
import re

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

import mmrepa
from mmrepa.apis import build_model
from mmrepa.engine.hooks import join_modules
from tests.helpers import (
    METAFORMER_TINY,
    ROOT,
    TINY_ARCH,
    backbone_outputs,
    feature_channels,
    set_feature_channels,
)

# Left out: fragments (not whole configs); mmdeploy's configs (configs/deploy/); the deploy
# variants (only deploy=True over a config tested here; folded builds are tested per backbone);
# the larger ImageNet MetaFormer and PoolFormer sizes, which shrink to the same tiny model as
# their s18 / s12 config and differ only in drop rates (and RePa-PoolFormer's in the optimizer's
# numbers); IdentityFormer-S12, whose recipe and blocks are RandFormer-S12's; the 4- and
# 3-layer depth re-parameterized ViT configs, which differ from the 6-layer ones in depth; the
# PRepBN-PVT and SLAB-PVT S / M configs, which differ from T in the arch, drop path, λ decay and
# checkpoint only (the same channels: nothing to wire).
_REDUNDANT = re.compile(
    r'(_deploy_in1k|(convformer|caformer)_(s36|m36|b36)_32xb128_in1k)\.py$'
    r'|(poolformer|poolformerv2|identityformer|randformer)_(s24|s36|m36|m48)_32xb128_in1k\.py$'
    r'|identityformer_s12_32xb128_in1k\.py$'  # randformer_s12's model without random mixing
    r'|depthrep_vit_tiny_d[34]_'
    r'|(prepbn|slab)_pvt_[sm]_(1x|8xb128)_'
    r'|_fsdp[-_]'  # a config above with a sharded runtime: tests/integration/test_fsdp.py
    r'|dmae_\w+_(pretrain|join)_in1k\.py$'  # MAE + teacher: tests/unit/selfsup (a made teacher)
)
CONFIGS = sorted(
    p
    for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    if not {'_base_', 'deploy'} & set(p.split(osp.sep)) and not _REDUNDANT.search(p)
)
H, W = 96, 128
# Larger sizes of a family (Swin S/B, MetaFormer S36/M36 in detection and segmentation; Swin S/B,
# RePa-, PRepBN-, SLAB-DeiT-S/B and RePa-LV-ViT-M classifiers): they inherit their smallest size's
# config and change the arch, drop path and the channels the neck / heads take. Shrunk, they are
# that config's tiny model, so only their channel wiring is checked and their model built; the
# smallest size runs loss and predict. Likewise RePa-DeiT's dense configs: a plain ViT through
# SimpleFPN into Mask R-CNN / UperNet, the pattern depth_rep_vit's configs run in full; and
# PoolFormer's Mask R-CNN and UperNet configs and its RePa RetinaNet: the (tiny) backbone runs
# in retinanet_poolformer_s12 and repa_poolformer_s12 (folded there too), the heads in the
# ConvFormer configs of the same recipes.
SIZE_VARIANT = re.compile(
    r'swin_[sb]_(1x|512x512|32xb128|8xb128)_'
    r'|(convformer|caformer)_(s36|m36)_(ms-3x|512x512)_'
    r'|deit_[sb]_(32xb128|8xb128)_|(mask-rcnn|upernet)_repa_deit_|lvvit_m_8xb128_'
    r'|mlp_mixer_l16_32xb128_'
    r'|mask-rcnn_prepbn_pvt_t_'  # PRepBN-PVT runs in RetinaNet; Mask R-CNN runs with PRepBN-Swin
    r'|(mask-rcnn|upernet|retinanet_repa)_poolformer_s12_'
)

# the folders of configs/ in each test_configs_<group>.py (about the same test time each)
GROUPS = {
    'metaformer': ('metaformer',),
    'repa_swin': ('repa_swin',),
    'others': ('prepbn_swin', 'prepbn_pvt', 'repopt_vgg', 'demo', 'poolformer'),
    # the plain (isotropic) backbones
    'plain': ('depth_rep_vit', 'repa_vit', 'prepbn_vit', 'mlp_mixer'),
}


def configs_of(group):
    return [c for c in CONFIGS if osp.relpath(c, ROOT).split(osp.sep)[1] in GROUPS[group]]


def config_id(path):
    return osp.relpath(path, ROOT)


# the configs that run at full size: one per backbone family (the cheapest of each)
FULL_SIZE = {
    'retinanet_repa_swin_t_1x_coco.py',  # RePaSwin
    'retinanet_swin_t_1x_coco.py',  # vanilla (mmdet) Swin: RePaSwin with idle_ratio=0, LN
    'retinanet_caformer_s18_1x_coco.py',  # published ConvFormer / CAFormer (both token mixers)
    'retinanet_repa_caformer_s18_1x_coco.py',  # RePa ConvFormer / CAFormer
    'retinanet_slab_swin_t_1x_coco.py',  # PRepBNSwin with linear attention (SLAB)
    'retinanet_prepbn_pvt_t_1x_coco.py',  # PRepBNPVT: mmdet's PVT-T config, its type changed
}
# the rest: same structure, small widths
REPOPT_TINY = dict(depths=(1, 2, 1, 1), widths=(8, 16, 16, 32), stem_width=8)
TINY_ARCHS = {
    'RePaSwin': TINY_ARCH,
    'PRepBNSwin': TINY_ARCH,
    'ConvFormer': METAFORMER_TINY,
    'CAFormer': METAFORMER_TINY,
    'PoolFormer': METAFORMER_TINY,
    'mmrepa.PoolFormer': METAFORMER_TINY,  # as mmpretrain configs name it
    'PoolFormerV2': METAFORMER_TINY,
    'IdentityFormer': METAFORMER_TINY,
    'RandFormer': METAFORMER_TINY,
    'RepOptVGG': REPOPT_TINY,
    'DepthRepViT': dict(embed_dims=16, num_layers=12, num_heads=2),
    # 12 blocks, so that the ViTDet configs' global blocks exist
    'RePaViT': dict(embed_dims=16, num_layers=12, num_heads=2),
    'PRepBNViT': dict(embed_dims=16, num_layers=12, num_heads=2),
    'MLPMixer': dict(
        embed_dims=16, num_layers=2, tokens_mlp_dims=8, channels_mlp_dims=64, patch_size=16
    ),
    'PRepBNPVT': dict(embed_dims=8, num_layers=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
}
# what else a tiny arch changes: MLP-Mixer's token MLPs and RandFormer's mixing matrices are
# made for one size, the test images'
TINY_OPTIONS = {'MLPMixer': dict(img_size=(H, W)), 'RandFormer': dict(img_size=(H, W))}


def det_inputs(with_mask):
    from mmdet.testing import demo_mm_inputs

    return demo_mm_inputs(
        batch_size=2,
        image_shapes=[(3, H, W)] * 2,
        num_items=[2, 3],
        num_classes=3,
        with_mask=with_mask,
    )


def seg_inputs(num_classes):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    samples = []
    for _ in range(2):
        s = SegDataSample(metainfo=dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W)))
        s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, H, W)))
        samples.append(s)
    return dict(
        inputs=[torch.randint(0, 256, (3, H, W), dtype=torch.uint8)] * 2, data_samples=samples
    )


def cls_inputs():
    from mmpretrain.structures import DataSample

    return dict(
        inputs=[torch.randint(0, 256, (3, H, W), dtype=torch.uint8)] * 2,
        data_samples=[DataSample().set_gt_label(label) for label in (1, 2)],
    )  # 3+ classes


# the widths inside the heads (never what they take in): mmseg's ``channels``, the RoI heads'
# convolutions and fully connected layers
NARROW = dict(channels=32, conv_out_channels=32, fc_out_channels=64)


def narrow(head):
    for key, width in NARROW.items():
        if key in head:
            head[key] = min(head[key], width)


def shrink(cfg):
    """Test-time budget: small padding, few proposals, narrow heads. The architecture is
    untouched: every layer stays, and so do the channels each head takes in (``in_channels``;
    what it takes from the backbone is checked by shrink_backbone); only the heads' own widths
    (NARROW: 512 / 256 / 1024 in the configs, the libraries' defaults) are small, which
    otherwise take most of a segmentation or two-stage config's time."""
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = (H, W)
        for key in ('decode_head', 'auxiliary_head'):
            heads = cfg.model.get(key) or []
            for head in heads if isinstance(heads, list) else [heads]:
                narrow(head)
    roi = cfg.model.get('roi_head') or {}
    for key in ('bbox_head', 'mask_head'):
        heads = roi.get(key) or []
        for head in heads if isinstance(heads, list) else [heads]:
            narrow(head)
    for key in ('train_cfg', 'test_cfg'):
        stage = cfg.model.get(key) or {}
        for name in ('rpn_proposal', 'rpn'):
            if isinstance(stage.get(name), dict) and 'nms_pre' in stage[name]:
                stage[name].update(nms_pre=50, max_per_img=10 if key == 'test_cfg' else 50)
        rcnn = stage.get('rcnn')
        for r in rcnn if isinstance(rcnn, list) else [rcnn]:
            if isinstance(r, dict) and 'sampler' in r:
                r.sampler.num = 16
            elif isinstance(r, dict) and 'max_per_img' in r:
                r.max_per_img = 20
    return cfg


def shrink_backbone(cfg):
    """Build the config's full-size backbone and check that the neck / heads expect its channels;
    then give the model a tiny arch of the same backbone type, the neck / heads following."""
    with torch.device('meta'):  # its channels only: no memory, no weight initialisation
        backbone = MODELS.build(cfg.model.backbone)
    outputs = backbone_outputs(backbone)
    consistent = copy.deepcopy(cfg.model)
    set_feature_channels(consistent, outputs)
    assert feature_channels(cfg.model) == feature_channels(consistent), (
        f'the neck / heads are configured for {feature_channels(cfg.model)}, the backbone gives '
        f'{outputs} (out_indices {backbone.out_indices})'
    )
    cfg.model.backbone.arch = TINY_ARCHS[cfg.model.backbone.type]
    cfg.model.backbone.update(TINY_OPTIONS.get(cfg.model.backbone.type, {}))
    tiny = MODELS.build(cfg.model.backbone)
    set_feature_channels(cfg.model, backbone_outputs(tiny))
    return cfg


def build(cfg):
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return build_model(cfg)  # as the Runner builds it; SyncBN (needs a GPU) reverted


def check_config(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports.imports[0] == 'mmrepa'
    backbone = cfg.model.backbone
    if (
        backbone.type == 'RepOptVGG'
        and backbone.get('mode', 'target') == 'target'
        and backbone.get('init_cfg')
    ):  # the official ImageNet checkpoints lack the constants
        assert isinstance(backbone.get('scales'), str), 'fine-tuning RepOpt-VGG needs scales='
    if isinstance(backbone.get('scales'), str):  # not here, and B1's would not fit a tiny arch
        backbone.scales = None
    if backbone.get('init_cfg'):
        assert backbone.init_cfg.type == 'Pretrained'
    if (
        osp.basename(path) not in FULL_SIZE
        and isinstance(backbone.get('arch'), str)
        and backbone.type in TINY_ARCHS
    ):
        cfg = shrink_backbone(cfg)
    model = build(shrink(cfg))
    if SIZE_VARIANT.search(osp.basename(path)):
        assert type(model.backbone).__name__ == cfg.model.backbone.type
        return
    # a backbone of another library, folded too
    foreign = any(not i.startswith('mmrepa') for i in cfg.custom_imports.imports)
    assert foreign or type(model.backbone).__module__.startswith('mmrepa.')
    if cfg.default_scope == 'mmseg':
        packed = seg_inputs(cfg.model.decode_head.num_classes)
    elif cfg.default_scope == 'mmpretrain':
        packed = cls_inputs()
    else:
        packed = det_inputs(with_mask='mask' in osp.basename(path))

    model.train()
    data = model.data_preprocessor(copy.deepcopy(packed), True)
    losses = model(**data, mode='loss')
    total = sum(v.sum() for k, v in losses.items() if 'loss' in k and torch.is_tensor(v)) + sum(
        sum(x.sum() for x in v) for k, v in losses.items() if 'loss' in k and isinstance(v, list)
    )
    assert torch.isfinite(total)
    total.backward()
    # the first trainable backbone parameter (the stem, unless frozen): gradients reach it
    first = next(p for p in model.backbone.parameters() if p.requires_grad)
    assert first.grad is not None

    model.eval()
    data = model.data_preprocessor(copy.deepcopy(packed), False)
    with torch.no_grad():
        preds = model(**data, mode='predict')
        assert len(preds) == 2
        # the folded backbone gives the same features, compared in float64: untrained RepBN
        # norms (PRepBN configs) do not normalise, and the resulting backbone is so
        # ill-conditioned that fp32 rounding alone moves its outputs by more than 1e-4, a
        # condition factor of ~2e3 over u32 = 6e-8; times u64 = 1.1e-16 that is ~1e-13, and
        # 1e-6 leaves room for conditions 10^7 times worse (a wrong fold moves them by 1e-2)
        backbone = copy.deepcopy(model.backbone).double()
        for _, m in join_modules(backbone):  # a model that joins branches folds once joined
            m.set_join_lambda(1.0)
        x = data['inputs'].double()
        feats = backbone(x)
        mmrepa.reparameterize(backbone)
        for a, b in zip(feats, backbone(x)):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6 * a.abs().max().item())
        # and the folded model still predicts
        model.backbone = backbone.float()
        mmrepa.reparameterize(model)
        assert len(model(**data, mode='predict')) == 2
