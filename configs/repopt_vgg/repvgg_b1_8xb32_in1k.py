# The RepVGG-B1 baseline of RepOptimizers' Table 2 (78.41 top-1 at batch 256): the same network
# trained with its 3x3, 1x1 and identity branches (each with its BN) and plain SGD, the same
# recipe otherwise; it folds into the same inference network as RepOpt-VGG-B1.
_base_ = './repopt_vgg_b1_8xb32_in1k.py'

model = dict(backbone=dict(mode='repvgg', scales=None))
optim_wrapper = dict(constructor='DefaultOptimWrapperConstructor', optimizer=dict(type='SGD'))
