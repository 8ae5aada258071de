# Depth re-parameterization, supervised route (DeiT-6-R), step 1 of 2: ViT-Tiny (12 heads of 16)
# trained as 6 blocks of 2 parallel branches with independent branches (λ = 0), DeiT recipe,
# 300 epochs. Step 2 (joining) is depthrep_vit_tiny_d6_8xb128_join_in1k.py; the folded 6-layer
# model reaches 70.2 % top-1 in the paper (Table 2). Classifier: mean of the patch tokens,
# LayerNorm (the backbone's output norm, the paper's fc_norm), Linear.
_base_ = [
    '../_base_/schedules/deit_adamw_in1k.py',
    '../_base_/models/in1k_classifier.py',
]
custom_imports = dict(imports=['mmrepa', 'mmrepa.classifiers'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='DepthRepViT',
        arch='tiny',
        depth=6,  # 12 layers as 6 blocks x 2 branches
        join='logits',  # the paper's network; 'qkv' is mmrepa's standard-shape extension
        img_size=224,
        out_type='avg',
        drop_path_rate=0.1,  # DeiT-Tiny's; the paper does not give one
        join_lambda=0.0,
    ),
    neck=None,
    head=dict(in_channels=192),
)
