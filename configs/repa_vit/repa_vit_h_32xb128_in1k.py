# RePa-ViT-H (RePaViT 'huge': 32 blocks of 1280 channels, 16 x 16 patches, idle ratio 0.75;
# 632 M parameters before folding) on ImageNet-1k in one process per GPU (DDP), with activation
# checkpointing; repa_vit_h_fsdp-64xb64_in1k.py is the same model sharded. RePaFormer gives no
# recipe for ViT-L/H (its Table 7 stops at DeiT-B): RePa-DeiT-B's, LAMB at batch 4096. Not
# trained by us.
_base_ = './repa_deit_b_32xb128_in1k.py'

model = dict(backbone=dict(arch='huge', with_cp=True), head=dict(in_channels=1280))
