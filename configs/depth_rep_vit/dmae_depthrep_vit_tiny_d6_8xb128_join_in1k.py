# D-MAE-6-R, step 2 of 3: joining with the pre-training configuration (the paper's A.2): from the
# pre-trained λ = 0 model, λ rises linearly from 0 to 1 over 10k iterations, then 50k iterations
# at λ = 1 (batch 1024), MAE and attention distillation as in step 1. The paper gives no
# learning-rate schedule for it: mmrepa's choice is step 1's lr, 1k warm-up iterations, cosine.
_base_ = './dmae_depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py'

load_from = 'work_dirs/dmae_depthrep_vit_tiny_d6_8xb128_pretrain_in1k/epoch_400.pth'
custom_hooks = [
    dict(type='BranchJoinScheduleHook', begin_iter=0, end_iter=10000, mode='linear'),
]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=60000)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, end=1000),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=False, begin=1000, end=60000),
]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=5000, max_keep_ckpts=3))
