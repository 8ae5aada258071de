# RePa-CAFormer-M36, the RePa version of
# cascade-mask-rcnn_caformer_m36_ms-3x_coco.py: channel-idle MLPs (idle ratio 0.75, BatchNorm
# pre-norm and hidden norm) that fold into three matrices for testing.
_base_ = './cascade-mask-rcnn_caformer_m36_ms-3x_coco.py'

pretrained = 'checkpoints/repa_caformer_m36_in1k.pth'  # RePa ImageNet weights (BN statistics)
model = dict(
    backbone=dict(
        idle_ratio=0.75,
        norm_eval=True,  # detection / segmentation batches are too small for BN statistics
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
