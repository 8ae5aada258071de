# ConvFormer-S18 for mmdet / mmseg configs (FPN / UperNet levels). Use: list this file in
# `_base_`, then model = dict(backbone=dict(_base_.convformer_backbone, _delete_=True,
# init_cfg=...)) with the recipe's overrides. CAFormer, other sizes and RePa versions override
# type / arch / idle_ratio on top, as the caformer_*, *_m36 and repa_* configs do.
convformer_backbone = dict(
    type='ConvFormer',
    arch='s18',
    idle_ratio=0.0,
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
    norm_eval=False,
    with_cp=False,
)
