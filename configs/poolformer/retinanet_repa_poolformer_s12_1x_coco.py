# RePa-PoolFormer-S12, the RePa version of retinanet_poolformer_s12_1x_coco.py: channel-idle
# MLPs (idle ratio 0.75, BatchNorm pre-norm and hidden norm) that fold into three matrices
# for testing. No paper trains it: the recipe is the PoolFormer release's.
_base_ = './retinanet_poolformer_s12_1x_coco.py'

pretrained = 'checkpoints/repa_poolformer_s12_in1k.pth'  # RePa ImageNet weights (BN statistics)
model = dict(
    backbone=dict(
        idle_ratio=0.75,
        norm_eval=True,  # detection batches are too small for BN statistics
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
