# The 1x schedule of mmdet's Swin detectors (configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py):
# AdamW (lr 1e-4, wd 0.05, no decay on norms and relative position tables), 1000-iteration
# linear warm-up, LR steps at epochs 8 and 11. Use it in place of mmdet's schedule_1x.py.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    paramwise_cfg=dict(
        custom_keys={
            'relative_position_bias_table': dict(decay_mult=0.0),
            'norm': dict(decay_mult=0.0),
        }
    ),
    optimizer=dict(_delete_=True, type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
)
