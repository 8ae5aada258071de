# RepOpt-VGG-B1 for mmdet / mmseg configs (FPN / UperNet levels). Use: list this file in
# `_base_`, then model = dict(backbone=dict(_base_.repopt_vgg_backbone, _delete_=True,
# scales=..., init_cfg=...)) with the recipe's overrides; RepVGG-B1: mode='repvgg', no scales.
repopt_vgg_backbone = dict(
    type='RepOptVGG',
    arch='B1',
    mode='target',
    out_indices=(0, 1, 2, 3),
    norm_eval=True,  # 2 images per GPU: keep the ImageNet BatchNorm statistics
)
