# Depth re-parameterization, step 2 of 2 (DeiT-6-R): from the λ = 0 model of step 1, λ rises
# linearly from 0 to 1 over 10k iterations, then 50k iterations at λ = 1 (the paper's 10k + 50k
# steps at batch 1024: 48 epochs), with the diversity loss (α = 0.05) during and after joining.
# Fold with tools/test.py --reparam (it refuses a checkpoint whose λ < 1) or
# tools/reparameterize.py; the paper evaluates the folded model without fine-tuning (70.2 %).
# The paper gives no learning-rate schedule for this run ("largely follows pre-training"):
# mmrepa's choice is the pre-training recipe's lr with 1 warm-up epoch and cosine decay.
_base_ = './depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py'

load_from = 'work_dirs/depthrep_vit_tiny_d6_8xb128_pretrain_in1k/epoch_300.pth'
model = dict(type='DiversityImageClassifier', backbone=dict(diversity_loss_weight=0.05))
custom_hooks = [
    dict(type='BranchJoinScheduleHook', begin_iter=0, end_iter=10000, mode='linear'),
]
train_cfg = dict(max_epochs=48)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1),
]
