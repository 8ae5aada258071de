# ImageNet-1k at 224 px with DeiT's augmentation, as all three papers train (RandAugment m9
# mstd0.5, random erasing 0.25, bicubic; Mixup 0.8 / CutMix 1.0 and label smoothing 0.1 are in
# the classifier, see ../models/in1k_classifier.py): mmpretrain's Swin data config, 128 images
# per process. The schedules say how many processes make the papers' global batch.
_base_ = 'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py'

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader
