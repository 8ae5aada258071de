# Mask R-CNN with the joined DeiT-6-R backbone (6 blocks of 2 branches at λ = 1), the paper's COCO
# setting (its Table 3: 38.1 box AP / 33.5 mask AP; the detectron2/ViTDet recipe of MAE-Lite's
# tiny models): ViTDet's simple feature pyramid, 640x640 large-scale jitter (0.1-2.0), batch 64
# (8 processes x 8), 100 epochs, AdamW (weight decay 0.05), steps at 22/25 and 24/25 of training
# (the paper: 24/27, 26/27), 250 warm-up iterations, drop path 0. The backbone is fine-tuned
# unfolded at λ = 1 and folded for testing (tools/test.py --reparam). Not in the paper: the lr
# (ViTDet's 1e-4 at batch 64), window 14 with global blocks 2 and 5 (ViTDet's "every third"),
# position embedding interpolated from the 224-px pretraining, no relative positions.
_base_ = ['../_base_/vitdet_mask-rcnn_lsj-100e_coco.py', '../_base_/models/depth_rep_vit.py']

pretrained = 'work_dirs/depthrep_vit_tiny_d6_8xb128_join_in1k/epoch_48.pth'
model = dict(
    backbone=dict(
        _base_.depthrep_vit_backbone,
        _delete_=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=192),
)
