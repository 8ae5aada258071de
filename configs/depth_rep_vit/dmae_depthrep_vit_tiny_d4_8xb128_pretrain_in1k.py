# D-MAE-4-R, step 1 of 3: as the 6-layer config, with 12 layers as 4 blocks x 3 branches.
_base_ = './dmae_depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py'

model = dict(backbone=dict(depth=4))
