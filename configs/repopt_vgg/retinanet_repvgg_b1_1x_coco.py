# The RepVGG-B1 baseline of retinanet_repopt_vgg_b1_1x_coco.py: multi-branch RepVGG-B1, plain SGD.
_base_ = './retinanet_repopt_vgg_b1_1x_coco.py'

pretrained = 'checkpoints/repvgg_b1_in1k.pth'
model = dict(backbone=dict(mode='repvgg', init_cfg=dict(checkpoint=pretrained)))
optim_wrapper = dict(constructor='DefaultOptimWrapperConstructor', optimizer=dict(type='SGD'))
