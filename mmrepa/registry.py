"""mmrepa's registry of layers, a child of mmengine's root ``MODELS``.

Backbones and hooks register in mmengine's root registries, so ``type='RePaSwin'`` resolves
from the mmdet, mmseg and mmpretrain scopes. Layers (``StarReLU``, ``PRepBN``, ...) have
generic names that another plugin may register too: they live in this ``mmrepa`` child
registry, reached from any scope as ``'mmrepa.PRepBN'``. Inside mmrepa's own configs the plain
name works too: :func:`build_norm_layer` and :func:`build_activation_layer` look here first.
"""

import copy
from typing import Tuple

import torch.nn as nn
from mmcv.cnn import build_activation_layer as _mmcv_build_activation
from mmcv.cnn import build_norm_layer as _mmcv_build_norm
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=ROOT_MODELS, scope='mmrepa', locations=['mmrepa.layers'])


def resolve_layer_type(cfg: dict) -> dict:
    """A copy of ``cfg`` whose ``type``, if it names an mmrepa layer (``'PRepBN'`` or
    ``'mmrepa.PRepBN'``), is the class itself; other types are left to mmcv's lookup."""
    cfg = copy.copy(cfg)
    layer_type = cfg.get('type')
    if isinstance(layer_type, str):
        name = layer_type[len('mmrepa.') :] if layer_type.startswith('mmrepa.') else layer_type
        cls = MODELS.get(name) if name in MODELS.module_dict else None
        if cls is not None:
            cfg['type'] = cls
    return cfg


def build_norm_layer(cfg: dict, num_features: int, postfix='') -> Tuple[str, nn.Module]:
    """mmcv's ``build_norm_layer`` that also finds mmrepa's norms (``RepBN``, ``PRepBN``)."""
    return _mmcv_build_norm(resolve_layer_type(cfg), num_features, postfix)


def build_activation_layer(cfg: dict) -> nn.Module:
    """mmcv's ``build_activation_layer`` that also finds mmrepa's activations (``StarReLU``)."""
    return _mmcv_build_activation(resolve_layer_type(cfg))
