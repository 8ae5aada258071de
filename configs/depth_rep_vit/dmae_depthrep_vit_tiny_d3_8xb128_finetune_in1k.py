# D-MAE-3-R, step 3 of 3: fine-tuning at λ = 1 with global average pooling, as the 6-layer
# config, then fold (the folded 3-layer model: 60.5 % top-1 in the paper's Table 1).
_base_ = './dmae_depthrep_vit_tiny_d6_8xb128_finetune_in1k.py'

model = dict(
    backbone=dict(
        depth=3,
        init_cfg=dict(
            checkpoint='work_dirs/dmae_depthrep_vit_tiny_d3_8xb128_join_in1k/iter_60000.pth'
        ),
    )
)
