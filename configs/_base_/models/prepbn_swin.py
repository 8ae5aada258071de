# PRepBN-Swin-T for mmdet / mmseg configs (FPN / UperNet levels). Use: list this file in
# `_base_`, then model = dict(backbone=dict(_base_.prepbn_swin_backbone, _delete_=True,
# init_cfg=...)) with the recipe's overrides; S: arch='small', drop_path_rate=0.3.
prepbn_swin_backbone = dict(
    type='PRepBNSwin',
    arch='tiny',
    idle_ratio=0.0,
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
    norm_eval=False,  # from LN weights: the RepBN statistics are learned while fine-tuning
    with_cp=False,
)
