# PoolFormer-S12 (v1) for mmdet / mmseg configs (FPN / UperNet levels), as the PoolFormer release
# builds it for detection: no drop path, a GroupNorm on each output. Use: list this file in
# `_base_`, then model = dict(backbone=dict(_base_.poolformer_backbone, _delete_=True,
# init_cfg=...)) with the recipe's overrides; other sizes and RePa-PoolFormer override arch /
# idle_ratio on top. In mmpretrain configs the type is 'mmrepa.PoolFormer' (mmpretrain's own
# PoolFormer would be found first).
poolformer_backbone = dict(
    type='PoolFormer',
    arch='s12',
    idle_ratio=0.0,
    drop_path_rate=0.0,
    out_indices=(0, 1, 2, 3),
    norm_eval=False,
    with_cp=False,
)
