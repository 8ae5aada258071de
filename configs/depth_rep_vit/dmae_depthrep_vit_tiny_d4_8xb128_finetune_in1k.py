# D-MAE-4-R, step 3 of 3: fine-tuning at λ = 1 with global average pooling, as the 6-layer
# config, then fold (the folded 4-layer model: 67.0 % top-1 in the paper's Table 1).
_base_ = './dmae_depthrep_vit_tiny_d6_8xb128_finetune_in1k.py'

model = dict(
    backbone=dict(
        depth=4,
        init_cfg=dict(
            checkpoint='work_dirs/dmae_depthrep_vit_tiny_d4_8xb128_join_in1k/iter_60000.pth'
        ),
    )
)
