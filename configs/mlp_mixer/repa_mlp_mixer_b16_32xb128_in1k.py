# RePa-MLPMixer-B/16 (idle ratio 0.75 in the channel MLPs, BatchNorm before fc1 and on the
# hidden layer) on ImageNet-1k with RePaFormer's recipe: LAMB, batch 4096, 300 epochs, 20
# warm-up epochs from 1e-6; learning rate, minimum, weight decay and drop path of the paper's
# Table 7 (the paper reports 72.1 % top-1, Table 1).
_base_ = [
    '../_base_/models/in1k_classifier.py',
    '../_base_/models/mlp_mixer.py',
    '../_base_/schedules/repaformer_lamb_in1k.py',
]

lr, min_lr = 0.005, 5e-06
model = dict(
    backbone=dict(_base_.repa_mlp_mixer_backbone, _delete_=True, drop_path_rate=0.04),
    head=dict(in_channels=768),
)
optim_wrapper = dict(optimizer=dict(lr=lr, weight_decay=0.13))
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=min_lr, by_epoch=True, begin=20),
]
