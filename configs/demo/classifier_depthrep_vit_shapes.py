# A small depth-reparameterized ViT classifier on the demo's one-shape images, trained from
# scratch in one run: independent branches (λ = 0) for the first 30 % of the iterations, joined
# linearly until 70 %, then at λ = 1, so the checkpoint folds exactly into a 2-block ViT.
# Not one of tools/demo.py's tasks: the deployment benchmark (benchmarks/deploy_table.py) trains
# it with
#   python tools/train.py configs/demo/classifier_depthrep_vit_shapes.py \
#       --work-dir work_dirs/demo/depthrep_vit
_base_ = './classifier_repa_caformer_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='DepthRepViT',
        arch=dict(embed_dims=96, num_layers=4, num_heads=6),
        num_branches=2,
        img_size=48,
        patch_size=6,  # an 8 x 8 token grid
        out_type='avg',
        init_cfg=None,
    ),
    neck=None,
    head=dict(in_channels=96),
)
optim_wrapper = dict(optimizer=dict(lr=3e-4))  # 1e-3 (the CAFormer's) stalls this ViT
custom_hooks = [dict(type='BranchJoinScheduleHook', begin_ratio=0.3, end_ratio=0.7)]
max_epochs = 30
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=300),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
    ),
]
default_hooks = dict(checkpoint=dict(interval=max_epochs))
