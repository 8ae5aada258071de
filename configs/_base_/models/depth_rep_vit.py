# The joined DeiT-6-R (DepthRepViT) for mmdet / mmseg configs: the stride-16 map of the last
# block for ViTDet's SimpleFPN, windows of 14 with global blocks 2 and 5. Use: list this file
# in `_base_`, then model = dict(backbone=dict(_base_.depthrep_vit_backbone, _delete_=True,
# init_cfg=...)); DeiT-3-R / 4-R: depth=3 / 4 and their global_blocks.
depthrep_vit_backbone = dict(
    type='DepthRepViT',
    arch='tiny',
    depth=6,
    join='logits',
    img_size=224,
    with_cls_token=False,
    out_type='featmap',
    out_indices=(-1,),
    window_size=14,
    global_blocks=(2, 5),
    join_lambda=1.0,  # the joined model: BranchJoinScheduleHook is not needed
)
