# The demo detector with mmpretrain's RepVGG-A0 as its backbone: a foreign reparameterizable
# network that mmrepa folds by mmpretrain's own convention (switch_to_deploy), in
# tools/test.py --reparam, tools/reparameterize.py and mmrepa.reparameterize.
_base_ = './retinanet_repa_swin_shapes.py'
custom_imports = dict(imports=['mmrepa', 'mmpretrain.models'], allow_failed_imports=False)

model = dict(
    backbone=dict(_delete_=True, type='mmpretrain.RepVGG', arch='A0', out_indices=(1, 2, 3)),
    neck=dict(in_channels=[96, 192, 1280]),
)
