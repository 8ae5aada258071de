# Mask R-CNN, multi-scale 3x, with a CAFormer-S18 backbone: the ConvFormer-S18 config (same
# recipe) with CAFormer, whose stages 3-4 mix tokens with self-attention.
_base_ = './mask-rcnn_convformer_s18_ms-3x_coco.py'

pretrained = 'checkpoints/caformer_s18.sail_in1k.pth'
model = dict(
    backbone=dict(
        type='CAFormer',
        # windows = the 224-pretraining token grids: bounded memory at 800 x 1333
        window_size=(None, None, 14, 7),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
