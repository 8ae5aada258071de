# RepOpt-VGG-B2 on ImageNet-1k (RepOptimizers, Table 2: 79.36 top-1 at batch 256), with the
# Hyper-Search scales of B2; otherwise as repopt_vgg_b1_8xb32_in1k.py.
_base_ = './repopt_vgg_b1_8xb32_in1k.py'

scales = 'checkpoints/RepOpt-VGG-B2-scales.pth'
model = dict(backbone=dict(arch='B2', scales=scales), head=dict(in_channels=2560))
