# Mask R-CNN 1x with a PRepBN-PVT-S backbone (SLAB Table 3); as mask-rcnn_prepbn_pvt_t_1x_coco.py.
_base_ = './mask-rcnn_prepbn_pvt_t_1x_coco.py'

pretrained = 'https://github.com/whai362/PVT/releases/download/v2/pvt_small.pth'
model = dict(backbone=dict(arch='small', init_cfg=dict(type='Pretrained', checkpoint=pretrained)))
