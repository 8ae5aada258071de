# Mask R-CNN with RePa-DeiT-S through ViTDet's simple feature pyramid. RePaFormer fine-tunes its
# dense models with "the configurations from MMDetection" (§5.1) without naming the plain-ViT
# one; this is ViTDet's recipe as mmdet's ViTDet project and the DepthRep-ViT configs run it:
# 640x640 large-scale jitter (0.1-2.0), batch 64 (8 processes x 8), 100 epochs, AdamW (lr 1e-4,
# weight decay 0.05), steps at 22/25 and 24/25 of training, 250 warm-up iterations. The
# backbone's BatchNorms (in the RePa FFNs) stay frozen (norm_eval); it is fine-tuned unfolded
# and folded for testing (tools/test.py --reparam). No result in the paper.
_base_ = ['../_base_/vitdet_mask-rcnn_lsj-100e_coco.py', '../_base_/models/repa_vit.py']

pretrained = 'work_dirs/repa_deit_s_32xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        _base_.repa_vit_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=384),
)
