# RePa-ViT-H (RePaViT 'huge': 32 blocks of 1280 channels, 16 x 16 patches, idle ratio 0.75;
# 632 M parameters before folding) on ImageNet-1k, sharded (FSDP) over 64 processes x 64 images
# with activation checkpointing. RePaFormer gives no recipe for ViT-L/H (its Table 7 stops at
# DeiT-B): RePa-DeiT-B's, with AdamW in place of LAMB (whose per-tensor trust ratio needs whole
# tensors, which sharding splits). Not trained by us; docs/training.md has its per-rank memory.
#   GPUS=64 GPUS_PER_NODE=8 tools/slurm_train.sh PARTITION repa_vit_h \
#       configs/repa_vit/repa_vit_h_fsdp-64xb64_in1k.py work_dirs/repa_vit_h_fsdp
_base_ = ['./repa_deit_b_32xb128_in1k.py', '../_base_/runtime/fsdp.py']

model = dict(backbone=dict(arch='huge', with_cp=True), head=dict(in_channels=1280))
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(optimizer=dict(_delete_=True, type='AdamW', lr=4e-3, weight_decay=0.07))
strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['RePaViTBlock'])))
