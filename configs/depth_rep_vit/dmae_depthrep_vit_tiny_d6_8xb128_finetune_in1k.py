# D-MAE-6-R, step 3 of 3: supervised fine-tuning of the joined model, still multi-branch, at
# λ = 1 (the paper's A.3 and Table 9), then fold: tools/test.py --reparam or
# tools/reparameterize.py (the folded 6-layer model: 72.4 % top-1 in the paper's Table 1).
# Global average pooling of the patch tokens (then LayerNorm, the paper's fc_norm) instead of
# the class token (§4). 300 epochs, AdamW, base lr 1e-3 per 256 images at batch 1024 (the
# linear scaling rule of A.3: 4e-3), betas (0.9, 0.999), weight decay 0.05, layer-wise lr decay
# 0.85 over the 6 blocks, 5 warm-up epochs, cosine; RandAugment (magnitude 10, std 0.5), Mixup
# 0.2, no CutMix, no label smoothing, no drop path. Not in the paper: random erasing 0.25 and the
# minimum lr, as mmpretrain's MAE fine-tuning; timm ignores colour jitter under RandAugment.
_base_ = [
    '../_base_/schedules/deit_adamw_in1k.py',
    '../_base_/models/in1k_classifier.py',
]
custom_imports = dict(imports=['mmrepa', 'mmrepa.heads'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='DepthRepViT',
        arch='tiny',
        depth=6,
        join='logits',
        img_size=224,
        out_type='avg',  # mean of the patch tokens, then the output LayerNorm
        drop_path_rate=0.0,
        join_lambda=1.0,  # joined: kept at 1 throughout (Table 4)
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/dmae_depthrep_vit_tiny_d6_8xb128_join_in1k/iter_60000.pth',
            num_heads=12,  # the pre-training config's MAEDepthRepViT, 'tiny': 12 heads
        ),
    ),
    neck=None,
    head=dict(in_channels=192, loss=dict(_delete_=True, type='CrossEntropyLoss', loss_weight=1.0)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.2)], _delete_=True),
)
bgr_mean = [103.53, 116.28, 123.675]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=10,
        magnitude_std=0.5,
        hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic'),
    ),
    dict(
        type='RandomErasing',
        erase_prob=0.25,
        mode='rand',
        min_area_ratio=0.02,
        max_area_ratio=1 / 3,
        fill_color=bgr_mean,
        fill_std=[57.375, 57.12, 58.395],
    ),
    dict(type='PackInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
lr = 1e-3 * 1024 / 256
optim_wrapper = dict(
    optimizer=dict(lr=lr),
    constructor='LearningRateDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.85),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5),
]
