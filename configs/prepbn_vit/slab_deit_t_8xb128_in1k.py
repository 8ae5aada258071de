# SLAB-DeiT-T on ImageNet-1k: simplified linear attention in every block over the whole
# 14 x 14 token grid, PRepBN everywhere, no class token (average of the patch tokens), SLAB's
# recipe (slab_adamw_in1k.py; the paper reports 74.3 % top-1, Table 2). Not in the paper: the
# λ decay over 60,000 iterations and drop path 0 are the authors' released slab_deit.py and
# slab_deit_t.yaml. SLAB pools after its final norm, mmrepa before it (the output norm).
_base_ = './prepbn_deit_t_8xb128_in1k.py'

model = dict(backbone=dict(attn_types='L', with_cls_token=False, out_type='avg'))
custom_hooks = [
    dict(type='PRepBNScheduleHook', warmup_iters=0, decay_iters=60000),
    dict(type='BNRecalibrationHook', num_batches=12510),
]
