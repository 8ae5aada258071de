# RepOpt-VGG-B1 on ImageNet-1k (RepOptimizers, Table 2: 78.47 top-1 at batch 256): the plain
# network trained with RepOptSGD and the Hyper-Search scales of B1 (searched on CIFAR-100 with
# hs_repopt_vgg_b1_cifar100.py, exported by tools/misc/repopt_export_scales.py, or the released
# RepOpt-VGG-B1-scales.pth). Trained from scratch: the rule of initialization runs in
# init_weights, never over loaded or resumed weights.
_base_ = ['../_base_/schedules/repopt_sgd_120e_in1k.py']
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

scales = 'checkpoints/RepOpt-VGG-B1-scales.pth'
model = dict(
    type='ImageClassifier',
    backbone=dict(type='RepOptVGG', arch='B1', mode='target', scales=scales, out_indices=(3,)),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=2048,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1, 5),
    ),
)
