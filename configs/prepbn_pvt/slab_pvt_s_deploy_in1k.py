# slab_pvt_s_8xb128_in1k.py built folded (deploy=True): loads classifier checkpoints folded by
# tools/reparameterize.py, for mmpretrain's own tools and inferencer.
_base_ = './slab_pvt_s_8xb128_in1k.py'

model = dict(backbone=dict(deploy=True))
