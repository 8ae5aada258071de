# RePaFormer's ImageNet-1k recipe (paper §5.1 and appendix Table 7): LAMB, global batch 4096
# (32 processes x 128), 300 epochs, cosine decay, 20 warm-up epochs from 1e-6. The learning
# rate, its minimum and the weight decay are per model (Table 7): each config sets them and
# its own param_scheduler. The RePa FFN's BatchNorms are synchronised across processes.
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../datasets/imagenet_deit_224.py',
]

optim_wrapper = dict(
    optimizer=dict(type='Lamb', lr=5e-3, weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={'.relative_position_bias_table': dict(decay_mult=0.0)},
    ),
)
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()
sync_bn = 'torch'
# the learning rate is the paper's for 4096 images per step; --auto-scale-lr scales it to
# the real global batch (processes x batch_size)
auto_scale_lr = dict(base_batch_size=4096)
