# Cascade Mask R-CNN 1x with a RepOpt-VGG-B1 backbone (RepOptimizers, Table 7: 43.50 COCO mAP):
# the ImageNet-trained plain network (repopt_vgg_b1_8xb32_in1k.py) fine-tuned with RepOptSGD and
# the Hyper-Search constants it was trained with, as YOLOv6 keeps the RepOptimizer while
# fine-tuning; loaded weights are never re-initialized. `scales` names the constants, since the
# official ImageNet checkpoints do not carry them (one trained by mmrepa does, and they must
# agree; loading a checkpoint without them and without `scales` is an error). The paper does
# not say which optimizer it fine-tunes with: for plain SGD, --cfg-options
# optim_wrapper.constructor=DefaultOptimWrapperConstructor optim_wrapper.optimizer.type=SGD
_base_ = [
    'mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py',
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
        frozen_stages=1,  # the stem and stage 1, as mmdet's ResNet configs
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[128, 256, 512, 2048]),
)
optim_wrapper = dict(constructor='RepOptOptimWrapperConstructor', optimizer=dict(type='RepOptSGD'))
