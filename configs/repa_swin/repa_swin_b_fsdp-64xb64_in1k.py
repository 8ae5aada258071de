# RePa-Swin-B on ImageNet-1k, sharded (FSDP) over 64 processes x 64 images (the global batch
# 4096 of repa_swin_b_32xb128_in1k.py) with activation checkpointing. AdamW at the Swin-B
# recipe's settings instead of the paper's LAMB: LAMB's per-tensor trust ratio needs whole
# tensors, which sharding splits. Not trained by us; docs/training.md has its per-rank memory.
#   GPUS=64 GPUS_PER_NODE=8 tools/slurm_train.sh PARTITION repa_swin_b \
#       configs/repa_swin/repa_swin_b_fsdp-64xb64_in1k.py work_dirs/repa_swin_b_fsdp
_base_ = ['./repa_swin_b_32xb128_in1k.py', '../_base_/runtime/fsdp.py']

model = dict(backbone=dict(with_cp=True))
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=4e-3, weight_decay=0.05))
strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['RePaSwinBlock'])))
