# D-MAE-6-R, step 1 of 3 (the depth re-parameterization paper's self-supervised route, §4 and
# Table 8): MAE pre-training of ViT-Tiny (12 heads of 16) as 6 blocks x 2 branches (λ = 0), with
# attention maps distilled from an MAE-Base teacher (mean squared error against the maps averaged
# over the branches). 400 epochs, AdamW, base lr 1.5e-4 per 256 images at batch 1024 (8 x 128),
# betas (0.9, 0.95), weight decay 0.05, 40 warm-up epochs, cosine; mask ratio 0.75; a decoder of
# one block of width 192. Step 2 (joining): dmae_depthrep_vit_tiny_d6_8xb128_join_in1k.py;
# step 3 (fine-tuning, then fold): dmae_depthrep_vit_tiny_d6_8xb128_finetune_in1k.py.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs512_mae.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['mmrepa', 'mmrepa.selfsup'], allow_failed_imports=False)

model = dict(
    type='DistilledMAE',
    backbone=dict(
        type='MAEDepthRepViT',
        arch='tiny',
        depth=6,  # 12 layers as 6 blocks x 2 branches
        join='logits',  # the paper's network
        img_size=224,
        patch_size=16,
        mask_ratio=0.75,
        join_lambda=0.0,
    ),
    neck=dict(
        type='MAEPretrainDecoder',
        num_patches=196,
        patch_size=16,
        in_chans=3,
        embed_dim=192,
        decoder_embed_dim=192,
        decoder_depth=1,
        decoder_num_heads=3,  # not in the paper: DeiT-Tiny's 3 heads of 64
        mlp_ratio=4.0,
    ),
    head=dict(
        type='MAEPretrainHead',
        norm_pix=True,
        patch_size=16,
        loss=dict(type='PixelReconstructionLoss', criterion='L2'),
    ),
    # The teacher: mmpretrain's MAE ViT-B/16 (12 heads, as the student's blocks). Its weights
    # (mmpretrain's layout, e.g. its MAE ViT-B/16 pre-training checkpoint) are not shipped: put
    # them at this path or pass --cfg-options model.teacher_checkpoint=PATH.
    teacher=dict(type='MAEViT', arch='b', img_size=224, patch_size=16),
    teacher_checkpoint='checkpoints/mae_vit-base-p16_in1k.pth',
    distill_layers=[(-1, -1)],  # last block <- the teacher's last layer (MAE-Lite's pairing)
    distill_weight=1.0,
    init_cfg=[
        dict(type='Xavier', layer='Linear', distribution='uniform'),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
    ],
)

# _delete_: the key checks read the collate function's arguments, and mmengine's scope key is none
train_dataloader = dict(
    batch_size=128, num_workers=8, collate_fn=dict(_delete_=True, type='default_collate')
)
lr = 1.5e-4 * 1024 / 256
optim_wrapper = dict(
    type='OptimWrapper',  # MAE's recipe trains in mixed precision: AmpOptimWrapper on a GPU
    optimizer=dict(type='AdamW', lr=lr, betas=(0.9, 0.95), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.mask_token': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
        },
    ),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, end=40, convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=360,
        by_epoch=True,
        begin=40,
        end=400,
        convert_to_iter_based=True,
    ),
]
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=400)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3))
randomness = dict(seed=0, diff_rank_seed=True)
auto_scale_lr = dict(base_batch_size=1024)
