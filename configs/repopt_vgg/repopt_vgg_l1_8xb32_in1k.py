# RepOpt-VGG-L1 on ImageNet-1k (RepOptimizers, Table 2: 79.46 top-1 at batch 256), with the
# Hyper-Search scales of L1; otherwise as repopt_vgg_b1_8xb32_in1k.py.
_base_ = './repopt_vgg_b1_8xb32_in1k.py'

scales = 'checkpoints/RepOpt-VGG-L1-scales.pth'
model = dict(backbone=dict(arch='L1', scales=scales), head=dict(in_channels=2048))
