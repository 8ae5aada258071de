# Mask R-CNN with the joined DeiT-3-R backbone (3 blocks of 4 branches; the paper: 31.1 / 27.1 box / mask
# AP); recipe and choices as mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py, global blocks (2, ).
_base_ = './mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py'

pretrained = 'work_dirs/depthrep_vit_tiny_d3_8xb128_join_in1k/epoch_48.pth'
model = dict(
    backbone=dict(
        depth=3, global_blocks=(2,), init_cfg=dict(type='Pretrained', checkpoint=pretrained)
    )
)
