# RePa-LV-ViT-S (RePaViT 'lv-vit-s': LV-ViT's convolutional patch embedding, residual branches
# divided by skip_lam = 2, FFN ratio 3 with idle ratio 2/3, BatchNorm FFN) on ImageNet-1k with
# RePaFormer's recipe: LAMB, 300 epochs, 20 warm-up epochs; batch 1024 and learning rate,
# minimum, weight decay and drop path of the paper's Table 7 (the paper reports 81.6 % top-1,
# Table 1). Head: LV-ViT's, the class token's scores plus, with token labels (gt_token_label
# in the data samples), the token-labelling loss on every patch token; without them the plain
# classification loss (mmrepa.heads.TokenLabelClsHead). Mixing: LV-ViT's MixToken with a
# Beta(1, 1) box area and no Mixup / CutMix, as LV-ViT's release trains lvvit_s / lvvit_m
# (tlt/models/lvvit.py: mix_token=True, beta 1.0; main.py: --mixup 0, --cutmix 0 by default).
_base_ = ['../_base_/models/in1k_classifier.py', '../_base_/schedules/repaformer_lamb_in1k.py']

lr, min_lr = 1e-3, 1e-5
model = dict(
    backbone=dict(
        type='RePaViT',
        arch='lv-vit-s',
        idle_ratio=2 / 3,
        mlp_ratio=3,
        skip_lam=2.0,
        conv_stem=True,
        qkv_bias=False,
        ffn_norm='BN',
        out_type='raw',  # every token, for the token-labelling head
        out_indices=-1,
        drop_path_rate=0.05,
        mix_token=True,
        mix_token_beta=1.0,
    ),
    neck=None,
    head=dict(type='TokenLabelClsHead', in_channels=384, aux_weight=1.0, aux_pred_weight=0.5),
    train_cfg=None,  # MixToken instead of the Mixup / CutMix batch augments
)
optim_wrapper = dict(
    optimizer=dict(lr=lr, weight_decay=0.05),
    paramwise_cfg=dict(
        custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0)}
    ),
)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
# Table 7's batch for LV-ViT: 8 processes x 128
auto_scale_lr = dict(base_batch_size=1024)

# Token labelling with LV-ViT's label files (its README, "Label data": NFNet-F6's top-5 maps,
# <class folder>/<image name>.pt per training image): uncomment, with label_root their folder.
# TokenLabelCropFlip replaces RandomResizedCrop + RandomFlip and crops / flips the labels with
# the image; TokenLabelRandAugment (RandAugment's arguments) rotates, shears and translates them
# with the image too, as LV-ViT's release; PackInputs hands them to the head. See README.md.
# custom_imports = dict(
#     imports=['mmrepa', 'mmrepa.heads', 'mmrepa.datasets.token_label'],
#     allow_failed_imports=False,
# )
# bgr_mean, bgr_std = [103.53, 116.28, 123.675], [57.375, 57.12, 58.395]
# train_pipeline = [
#     dict(type='LoadImageFromFile'),
#     dict(
#         type='TokenLabelCropFlip',
#         scale=224,
#         label_root='data/imagenet/label_top5_train_nfnet',
#         label_size=14,  # 224 / 16: the token grid
#         flip_prob=0.5,
#         backend='pillow',
#         interpolation='bicubic',
#     ),
#     dict(
#         type='TokenLabelRandAugment',
#         policies='timm_increasing',
#         num_policies=2,
#         total_level=10,
#         magnitude_level=9,
#         magnitude_std=0.5,
#         hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic'),
#     ),
#     dict(
#         type='RandomErasing',
#         erase_prob=0.25,
#         mode='rand',
#         min_area_ratio=0.02,
#         max_area_ratio=1 / 3,
#         fill_color=bgr_mean,
#         fill_std=bgr_std,
#     ),
#     dict(type='PackInputs', algorithm_keys=('gt_token_label',)),
# ]
# train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
