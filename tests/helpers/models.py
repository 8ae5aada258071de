"""Small models, random weights and scales, and the channels a config's neck or heads read."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa.backbones import RepOptVGG
from mmrepa.backbones.repopt_vgg.blocks import _random_kernel

# A small RePa-Swin that still has every structural feature (shifted blocks, 4 stages).
TINY_ARCH = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere and non-trivial BN statistics, so no fold term is invisible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.25)
                if m.weight is not None:
                    m.weight.copy_(1 + torch.randn(m.weight.shape, generator=g) * 0.2)
    return model


def max_abs_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    return (a - b).abs().max().item()


def max_relative(a, b) -> float:
    """max |a - b| / max |b| (``b`` the reference); over tensors paired in two sequences, the
    largest of these, each tensor at its own scale."""
    if isinstance(a, (tuple, list)):
        return max(max_relative(x, y) for x, y in zip(a, b))
    return ((a - b).abs().max() / b.abs().max()).item()


# the MetaFormer and RepOpt-VGG counterparts of TINY_ARCH: same structure, small widths;
# MetaFormer's stages 3-4 stay multiples of CAFormer's head_dim 32 (RepOpt-VGG's: test_repopt_vgg's)
METAFORMER_TINY = dict(depths=(1, 1, 2, 1), dims=(16, 32, 64, 96))
REPOPT_VGG_TINY = dict(depths=(2, 2, 2, 1), widths=(8, 16, 16, 32), stem_width=8)


def csla_model_like(target, generator_seed):
    """A CSLA model with the target's constants and the K0, P0 the target's rule of
    initialization draws from the same seed."""
    csla = RepOptVGG(REPOPT_VGG_TINY, mode='csla', scales=target_scales(target))
    g = torch.Generator().manual_seed(generator_seed)
    with torch.no_grad():
        for layer in csla.layers().values():
            layer.conv.weight.copy_(_random_kernel(layer.conv.weight.shape, 'torch', g))
            layer.conv_1x1.weight.copy_(_random_kernel(layer.conv_1x1.weight.shape, 'torch', g))
    return csla


def target_scales(target):
    out = {}
    for name, m in target.layers().items():
        out[f'{name}.scale_conv.weight'] = m.scale_conv.clone()
        out[f'{name}.scale_1x1.weight'] = m.scale_1x1.clone()
        if m.has_identity:
            out[f'{name}.scale_identity.weight'] = m.scale_identity.clone()
    return out


def random_scales(model, seed):
    g = torch.Generator().manual_seed(seed)
    scales = {}
    for name, m in model.layers().items():
        for key in ('scale_conv', 'scale_1x1', 'scale_identity')[: 3 if m.has_identity else 2]:
            v = torch.randn(m.out_channels, generator=g)
            v[0] = 0.0 if key == 'scale_1x1' else v[0]
            scales[f'{name}.{key}.weight'] = v
    return scales


def _feature_users(model_cfg):
    """(config dict, indices into the backbone outputs) of what reads the backbone's features:
    the neck (all outputs, in order), or the decode / auxiliary heads (their ``in_index``)."""
    if model_cfg.type.endswith('ImageClassifier'):  # on the last output, maybe pooled
        return [(model_cfg.head, -1)]
    if model_cfg.get('neck'):
        return [(model_cfg.neck, None)]
    users = []
    for key in ('decode_head', 'auxiliary_head'):
        heads = model_cfg.get(key) or []
        for head in heads if isinstance(heads, list) else [heads]:
            users.append((head, head.get('in_index', -1)))
    return users


def feature_channels(model_cfg):
    """The backbone output channels the neck / heads of ``model_cfg`` are configured for."""
    return [user.in_channels for user, _ in _feature_users(model_cfg)]


def set_feature_channels(model_cfg, outputs):
    """Make the neck / heads take ``outputs`` (channels of each backbone output)."""
    for user, index in _feature_users(model_cfg):
        user.in_channels = (
            outputs[-1]
            if index is None and isinstance(user.in_channels, int)
            else list(outputs)
            if index is None
            else [outputs[i] for i in index]
            if isinstance(index, (list, tuple))
            else outputs[index]
        )


def backbone_outputs(backbone):
    return [backbone.num_features[i] for i in backbone.out_indices]
