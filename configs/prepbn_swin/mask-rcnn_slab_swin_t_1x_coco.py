# Mask R-CNN 1x with a SLAB-Swin-T backbone: PRepBN norms and simplified linear attention in
# stages 1-2 (windows of 56 and 28 tokens, the whole 224-px map of each stage as in ImageNet
# pretraining), Swin window attention in stages 3-4.
# The ImageNet SLAB-Swin-T weights (SLAB's release, LinearNorm layout, or mmrepa's own) are
# already pure RepBN: lambda stays 0 and the ImageNet BatchNorm statistics are kept.
_base_ = './mask-rcnn_prepbn_swin_t_1x_coco.py'

pretrained = 'checkpoints/slab_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        attn_types='LLSS',
        linear_window_sizes=(56, 28, 14, 7),
        norm_eval=True,  # 2 images per GPU: keep the ImageNet BatchNorm statistics
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)

custom_hooks = [dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=0)]
