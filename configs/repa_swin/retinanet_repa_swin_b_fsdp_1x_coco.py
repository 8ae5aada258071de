# RetinaNet with a sharded RePa-Swin-B backbone (FSDP units: the backbone's blocks; the neck
# and head in the root unit), with activation checkpointing; otherwise
# retinanet_repa_swin_b_1x_coco.py (mmdet's RetinaNet SGD schedule, 12 epochs, 16 images in total).
#   tools/dist_train.sh configs/repa_swin/retinanet_repa_swin_b_fsdp_1x_coco.py 8
_base_ = ['./retinanet_repa_swin_b_1x_coco.py', '../_base_/runtime/fsdp.py']

model = dict(backbone=dict(with_cp=True))
strategy = dict(model_wrapper=dict(auto_wrap_policy=dict(block_types=['RePaSwinBlock'])))
