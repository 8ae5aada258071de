# Depth re-parameterization, step 2 of 2 (DeiT-3-R; the paper: 58.5 % top-1 folded): joining of
# the 3x4 model; see depthrep_vit_tiny_d6_8xb128_join_in1k.py.
_base_ = './depthrep_vit_tiny_d6_8xb128_join_in1k.py'

load_from = 'work_dirs/depthrep_vit_tiny_d3_8xb128_pretrain_in1k/epoch_300.pth'
model = dict(backbone=dict(depth=3))
