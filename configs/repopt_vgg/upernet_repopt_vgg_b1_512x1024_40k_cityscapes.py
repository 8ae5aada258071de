# UperNet with a RepOpt-VGG-B1 backbone on Cityscapes, mmseg's 40k schedule at 512 x 1024
# (RepOptimizers, Table 7: 79.36 mIoU), fine-tuned with RepOptSGD and the B1 Hyper-Search
# constants (see cascade-mask-rcnn_repopt_vgg_b1_1x_coco.py for both choices and how to switch
# to plain SGD).
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    'mmseg::_base_/datasets/cityscapes.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_40k.py',
    '../_base_/models/repopt_vgg.py',
]
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

crop_size = (512, 1024)
norm_cfg = dict(type='SyncBN', requires_grad=True)
pretrained = 'checkpoints/repopt_vgg_b1_in1k.pth'
scales = 'checkpoints/RepOpt-VGG-B1-scales.pth'  # the constants it was trained with
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _base_.repopt_vgg_backbone,
        _delete_=True,
        scales=scales,
        norm_eval=False,  # 8 x 2 crops of 512 x 1024 with SyncBN: mmseg's ResNet recipe
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    decode_head=dict(in_channels=[128, 256, 512, 2048], num_classes=19, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=512, num_classes=19, norm_cfg=norm_cfg),
)
optim_wrapper = dict(constructor='RepOptOptimWrapperConstructor', optimizer=dict(type='RepOptSGD'))
