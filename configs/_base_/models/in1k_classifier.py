# mmpretrain's ImageClassifier on the last stage of an mmrepa backbone, trained as DeiT:
# label smoothing 0.1, Mixup 0.8 / CutMix 1.0 (one of the two per batch). The configs set
# `model.backbone` (type, arch, drop path, out_indices=(3, )) and the head's in_channels.
custom_imports = dict(imports=['mmrepa', 'mmrepa.heads'], allow_failed_imports=False)
model = dict(
    type='ImageClassifier',
    backbone=dict(out_indices=(3,)),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        init_cfg=None,  # the classifier's init_cfg below covers it
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False,
    ),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
    ],
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)
