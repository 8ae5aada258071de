# RePa-MLPMixer-B/16 for mmpretrain classifiers (MLP-Mixer has no detection or segmentation
# form: its token MLPs fix the input size). Use: list this file in `_base_`, then
# model = dict(backbone=dict(_base_.repa_mlp_mixer_backbone, _delete_=True, ...)). Other
# sizes override arch and drop_path_rate; the published MLP-Mixer is idle_ratio=0.0,
# ffn_norm='LN'.
repa_mlp_mixer_backbone = dict(
    type='MLPMixer',
    arch='b16',
    img_size=224,
    idle_ratio=0.75,
    ffn_norm='BN',
    drop_path_rate=0.04,
    out_indices=(-1,),
    with_cp=False,
)
