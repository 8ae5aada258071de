# UperNet 160k on ADE20K 512x512 with a CAFormer-S18 backbone: the ConvFormer-S18 config (same
# recipe) with CAFormer, whose stages 3-4 mix tokens with self-attention.
_base_ = './upernet_convformer_s18_512x512_160k_ade20k.py'

pretrained = 'checkpoints/caformer_s18.sail_in1k.pth'
model = dict(
    backbone=dict(
        type='CAFormer',
        # global attention: 32 x 32 and 16 x 16 tokens at 512 x 512
        window_size=None,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
