# The demo with a small RePa-CAFormer (windowed attention in stages 3-4) instead of RePa-Swin:
#     python tools/demo.py --config configs/demo/retinanet_repa_caformer_shapes.py
_base_ = './retinanet_repa_swin_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='CAFormer',
        arch=dict(depths=(1, 1, 2, 1), dims=(32, 64, 128, 256)),
        idle_ratio=0.75,
        window_size=(None, None, 4, 2),  # 8 x 8 and 4 x 4 maps at 128 px: 2 x 2 windows
        drop_path_rate=0.0,
        out_indices=(1, 2, 3),
        init_cfg=None,
    )
)
