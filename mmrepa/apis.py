"""Building a model from any mmrepa config, for the tools (mmdet and mmseg configs alike)."""
import copy
import importlib
from typing import Optional, Union

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint


def init_model(config: Union[str, Config], checkpoint: Optional[str] = None,
               device: Union[str, torch.device] = 'cpu',
               cfg_options: Optional[dict] = None) -> nn.Module:
    """Build the config's model in its default scope, load ``checkpoint``, eval mode.

    SyncBN is reverted to BN (outside a process group it cannot run). The backbone's
    ``init_cfg`` weights are not loaded; ``checkpoint`` is, strictly. The config is attached as
    ``model.cfg``.
    """
    cfg = Config.fromfile(config) if isinstance(config, str) else copy.deepcopy(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope', 'mmengine')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry')
    model = revert_sync_batchnorm(registry.MODELS.build(cfg.model))
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
    model.cfg = cfg
    return model.to(device).eval()
