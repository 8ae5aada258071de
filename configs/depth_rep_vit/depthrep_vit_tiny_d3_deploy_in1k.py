# The folded DeiT-3-R: 3 plain ViT blocks (heads of width 4·16 under the paper's logit
# join), for checkpoints written by tools/reparameterize.py.
_base_ = './depthrep_vit_tiny_d3_8xb128_join_in1k.py'

model = dict(type='ImageClassifier', backbone=dict(deploy=True, diversity_loss_weight=0.0))
custom_hooks = []
load_from = None
