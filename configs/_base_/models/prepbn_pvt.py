# PRepBN-PVT-T for mmdet / mmseg configs (FPN levels). Use: list this file in `_base_`, then
# model = dict(backbone=dict(_base_.prepbn_pvt_backbone, _delete_=True, init_cfg=...)) with the
# recipe's overrides; S / M: arch='small' / 'medium'.
prepbn_pvt_backbone = dict(
    type='PRepBNPVT',
    arch='tiny',
    drop_path_rate=0.1,  # mmdet's PVT detectors
    out_indices=(0, 1, 2, 3),
    norm_eval=False,  # from LN weights: the RepBN statistics are learned while fine-tuning
    with_cp=False,
)
