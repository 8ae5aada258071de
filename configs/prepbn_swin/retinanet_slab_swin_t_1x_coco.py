# RetinaNet 1x with a SLAB-Swin-T backbone (PRepBN norms, simplified linear attention in stages
# 1-2). The ImageNet SLAB weights are already pure RepBN: lambda stays 0, statistics are kept.
_base_ = './retinanet_prepbn_swin_t_1x_coco.py'

pretrained = 'checkpoints/slab_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        attn_types='LLSS',
        linear_window_sizes=(56, 28, 14, 7),
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)

custom_hooks = [dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=0)]
