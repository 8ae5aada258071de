# RetinaNet 1x with a RepOpt-VGG-B1 backbone, fine-tuned with RepOptSGD and the B1 Hyper-Search
# constants as cascade-mask-rcnn_repopt_vgg_b1_1x_coco.py (no result in the paper for this
# detector).
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repopt_vgg_b1_in1k.pth'
scales = 'checkpoints/RepOpt-VGG-B1-scales.pth'  # the constants it was trained with
model = dict(
    backbone=dict(
        _delete_=True,
        type='RepOptVGG',
        arch='B1',
        mode='target',
        scales=scales,
        out_indices=(1, 2, 3),  # only what the FPN uses
        frozen_stages=1,
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(in_channels=[256, 512, 2048], start_level=0, num_outs=5),
)
optim_wrapper = dict(constructor='RepOptOptimWrapperConstructor', optimizer=dict(type='RepOptSGD'))
