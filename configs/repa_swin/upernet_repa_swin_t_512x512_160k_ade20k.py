# UperNet 160k on ADE20K 512x512 with a RePa-Swin-T backbone, recipe of mmseg's
# configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py.
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'
custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False)

pretrained = 'checkpoints/repa_swin_tiny_in1k.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='RePaSwin',
        arch='tiny',
        idle_ratio=0.75,
        ffn_norm='BN',
        drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        norm_eval=True,  # 2 images per GPU: keep the ImageNet BN statistics
        with_cp=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    )
)
