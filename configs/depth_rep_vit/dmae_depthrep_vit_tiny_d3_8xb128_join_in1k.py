# D-MAE-3-R, step 2 of 3: joining, as the 6-layer config (λ 0 -> 1 over 10k iterations, then
# 50k at λ = 1), from the 3-block pre-training.
_base_ = './dmae_depthrep_vit_tiny_d6_8xb128_join_in1k.py'

model = dict(backbone=dict(depth=3))
load_from = 'work_dirs/dmae_depthrep_vit_tiny_d3_8xb128_pretrain_in1k/epoch_400.pth'
