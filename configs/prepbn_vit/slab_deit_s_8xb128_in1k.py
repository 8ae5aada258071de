# SLAB-DeiT-S: SLAB-DeiT-T's model and recipe (slab_deit_t_8xb128_in1k.py) at PRepBNViT
# 'small', as the authors' slab_deit_s.yaml (the paper reports 80.0 % top-1, Table 2).
_base_ = './slab_deit_t_8xb128_in1k.py'

model = dict(backbone=dict(arch='small'), head=dict(in_channels=384))
