# RePa-Swin-T for mmdet / mmseg configs (FPN / UperNet levels). Use: list this file in `_base_`,
# then model = dict(backbone=dict(_base_.repa_swin_backbone, _delete_=True, init_cfg=...)) with
# the recipe's overrides; S / B: arch='small' / 'base', drop_path_rate=0.3 (the *_s / *_b configs).
repa_swin_backbone = dict(
    type='RePaSwin',
    arch='tiny',
    idle_ratio=0.75,
    ffn_norm='BN',
    drop_path_rate=0.2,
    out_indices=(0, 1, 2, 3),
    norm_eval=True,  # detection / segmentation batches are too small to update BN statistics
    with_cp=False,
)
