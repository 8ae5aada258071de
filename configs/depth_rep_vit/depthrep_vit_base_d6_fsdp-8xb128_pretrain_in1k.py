# DepthRepViT-Base (ViT-B widths, 12 layers as 6 blocks x 2 branches) pretraining, step 1 of the
# supervised route, sharded (FSDP) over 8 processes x 128 images: one JoinedBlock per unit.
# DeiT's AdamW recipe as depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py, DeiT-B's drop path.
_base_ = ['./depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py', '../_base_/runtime/fsdp.py']

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.1, with_cp=True), head=dict(in_channels=768)
)
strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['JoinedBlock'])))
