# Depth re-parameterization, step 1 of 2 (DeiT-3-R): ViT-Tiny as 3 blocks of 4 branches at λ = 0;
# see depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py.
_base_ = './depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py'

model = dict(backbone=dict(depth=3))
