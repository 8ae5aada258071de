# CAFormer-B36 on ImageNet-1k, sharded (FSDP) over 64 processes x 64 images (global batch 4096,
# as caformer_b36_32xb128_in1k.py) with activation checkpointing. AdamW instead of LAMB (its
# per-tensor trust ratio needs whole tensors, which sharding splits), at MetaFormer's AdamW
# settings scaled to batch 4096.
_base_ = ['./caformer_b36_32xb128_in1k.py', '../_base_/runtime/fsdp.py']

model = dict(backbone=dict(with_cp=True))
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=4e-3, weight_decay=0.05))
strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['MetaFormerBlock'])))
