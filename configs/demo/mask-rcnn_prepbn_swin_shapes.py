# `tools/demo.py --task mask-rcnn`: a small PRepBN-Swin Mask R-CNN trained from scratch on the
# generated shapes (their COCO polygons are the instance masks) in a few CPU minutes. Every norm
# inside the backbone goes from LayerNorm to RepBN while training (PRepBNScheduleHook) and folds
# into its neighbour at test time. Real data: configs/prepbn_swin/mask-rcnn_prepbn_swin_t_1x_coco.py.
_base_ = './retinanet_repa_swin_shapes.py'  # data set, optimizer, runtime

model = dict(
    _delete_=True,
    type='MaskRCNN',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_mask=True,
        pad_size_divisor=32,
    ),
    backbone=dict(
        type='PRepBNSwin',
        arch=dict(embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)),
        window_size=4,
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        norm_eval=False,  # the RepBN branches learn their statistics while lambda decays
        init_cfg=None,
    ),
    neck=dict(type='FPN', in_channels=[32, 64, 128, 256], out_channels=64, num_outs=5),
    rpn_head=dict(
        type='RPNHead',
        in_channels=64,
        feat_channels=64,
        # shapes are 23-56 px wide: anchors of 16-256 px instead of 32-512
        anchor_generator=dict(
            type='AnchorGenerator', scales=[4], ratios=[0.5, 1.0, 2.0], strides=[4, 8, 16, 32, 64]
        ),
        bbox_coder=dict(
            type='DeltaXYWHBBoxCoder',
            target_means=[0.0, 0.0, 0.0, 0.0],
            target_stds=[1.0, 1.0, 1.0, 1.0],
        ),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0),
    ),
    roi_head=dict(
        type='StandardRoIHead',
        bbox_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=2),
            out_channels=64,
            featmap_strides=[4, 8, 16, 32],
        ),
        bbox_head=dict(
            type='Shared2FCBBoxHead',
            in_channels=64,
            fc_out_channels=256,
            roi_feat_size=7,
            num_classes=3,
            bbox_coder=dict(
                type='DeltaXYWHBBoxCoder',
                target_means=[0.0, 0.0, 0.0, 0.0],
                target_stds=[0.1, 0.1, 0.2, 0.2],
            ),
            reg_class_agnostic=False,
            loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type='L1Loss', loss_weight=1.0),
        ),
        mask_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=2),
            out_channels=64,
            featmap_strides=[4, 8, 16, 32],
        ),
        mask_head=dict(
            type='FCNMaskHead',
            num_convs=2,
            in_channels=64,
            conv_out_channels=64,
            num_classes=3,
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0),
        ),
    ),
    # at most 3 objects per image: far fewer samples and proposals than COCO's 512 and 1000
    train_cfg=dict(
        rpn=dict(
            assigner=dict(
                type='MaxIoUAssigner',
                pos_iou_thr=0.7,
                neg_iou_thr=0.3,
                min_pos_iou=0.3,
                match_low_quality=True,
                ignore_iof_thr=-1,
            ),
            sampler=dict(
                type='RandomSampler',
                num=128,
                pos_fraction=0.5,
                neg_pos_ub=-1,
                add_gt_as_proposals=False,
            ),
            allowed_border=-1,
            pos_weight=-1,
            debug=False,
        ),
        rpn_proposal=dict(
            nms_pre=500, max_per_img=100, nms=dict(type='nms', iou_threshold=0.7), min_bbox_size=0
        ),
        rcnn=dict(
            assigner=dict(
                type='MaxIoUAssigner',
                pos_iou_thr=0.5,
                neg_iou_thr=0.5,
                min_pos_iou=0.5,
                match_low_quality=True,
                ignore_iof_thr=-1,
            ),
            sampler=dict(
                type='RandomSampler',
                num=32,
                pos_fraction=0.25,
                neg_pos_ub=-1,
                add_gt_as_proposals=True,
            ),
            mask_size=28,
            pos_weight=-1,
            debug=False,
        ),
    ),
    test_cfg=dict(
        rpn=dict(
            nms_pre=300, max_per_img=50, nms=dict(type='nms', iou_threshold=0.7), min_bbox_size=0
        ),
        rcnn=dict(
            score_thr=0.05,
            nms=dict(type='nms', iou_threshold=0.5),
            max_per_img=20,
            mask_thr_binary=0.5,
        ),
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'),
    ),
]
# BNRecalibrationHook iterates the training loader from inside the last iteration; with
# persistent workers that restarts the loader the epoch loop is still reading, and training runs
# on past the recalibration (and max_iters) until that second pass ends
train_dataloader = dict(persistent_workers=False, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(metric=['bbox', 'segm'])
test_evaluator = dict(val_evaluator, classwise=True)  # per-class AP in the test log

max_epochs = 8  # 400 iterations
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
    ),
]
default_hooks = dict(checkpoint=dict(interval=max_epochs))

custom_hooks = [
    # pure LayerNorm for the first 50 iterations, then lambda falls linearly to 0 (pure RepBN)
    # at 60 % of training, so the last 40 % train the network the test folds
    dict(type='PRepBNScheduleHook', warmup_iters=50, decay_ratio=0.6),
    # the running statistics trail the weights: re-estimate them with the final weights
    dict(type='BNRecalibrationHook', num_batches=20),
]
