# The RepVGG-B1 baseline of RepOptimizers' Table 7 (43.60 COCO mAP): the same detector with the
# multi-branch RepVGG-B1 (repvgg_b1_8xb32_in1k.py weights) and plain SGD.
_base_ = './cascade-mask-rcnn_repopt_vgg_b1_1x_coco.py'

pretrained = 'checkpoints/repvgg_b1_in1k.pth'
model = dict(backbone=dict(mode='repvgg', init_cfg=dict(checkpoint=pretrained)))
optim_wrapper = dict(constructor='DefaultOptimWrapperConstructor', optimizer=dict(type='SGD'))
