# CAFormer's ImageNet-1k recipe (MetaFormer Baselines, appendix Table XIV): the MetaFormer
# schedule with LAMB at 8e-3 instead of AdamW, shared by CAFormer-S18/S36/M36/B36.
_base_ = ['./metaformer_in1k.py']

lr = 8e-3
optim_wrapper = dict(optimizer=dict(_delete_=True, type='Lamb', lr=lr, weight_decay=0.05))
# the warm-up starts from 1e-6 of the new rate: the schedule is restated with it
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6 / lr, by_epoch=True, end=20, convert_to_iter_based=True
    ),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20),
]
