# Mask R-CNN with the joined DeiT-4-R backbone (4 blocks of 3 branches; the paper: 35.1 / 31.4 box / mask
# AP); recipe and choices as mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py, global blocks (1, 3).
_base_ = './mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py'

pretrained = 'work_dirs/depthrep_vit_tiny_d4_8xb128_join_in1k/epoch_48.pth'
model = dict(
    backbone=dict(
        depth=4, global_blocks=(1, 3), init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    )
)
