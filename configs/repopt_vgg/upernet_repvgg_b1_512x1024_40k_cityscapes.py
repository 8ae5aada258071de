# The RepVGG-B1 baseline of RepOptimizers' Table 7 (79.15 mIoU): multi-branch RepVGG-B1, plain SGD.
_base_ = './upernet_repopt_vgg_b1_512x1024_40k_cityscapes.py'

pretrained = 'checkpoints/repvgg_b1_in1k.pth'
model = dict(backbone=dict(mode='repvgg', init_cfg=dict(checkpoint=pretrained)))
optim_wrapper = dict(constructor='DefaultOptimWrapperConstructor', optimizer=dict(type='SGD'))
