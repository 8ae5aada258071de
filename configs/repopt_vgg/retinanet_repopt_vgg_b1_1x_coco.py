# RetinaNet 1x with a RepOpt-VGG-B1 backbone, fine-tuned with RepOptSGD and the B1 Hyper-Search
# constants as cascade-mask-rcnn_repopt_vgg_b1_1x_coco.py (no result in the paper for this
# detector).
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    '../_base_/models/repopt_vgg.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repopt_vgg_b1_in1k.pth'
scales = 'checkpoints/RepOpt-VGG-B1-scales.pth'  # the constants it was trained with
model = dict(
    backbone=dict(
        _base_.repopt_vgg_backbone,
        _delete_=True,
        scales=scales,
        out_indices=(1, 2, 3),  # only what the FPN uses
        frozen_stages=1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[256, 512, 2048], start_level=0, num_outs=5),
)
optim_wrapper = dict(constructor='RepOptOptimWrapperConstructor', optimizer=dict(type='RepOptSGD'))
