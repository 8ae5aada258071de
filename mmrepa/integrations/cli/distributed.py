"""Distributed runs of ``tools/train.py`` and ``tools/test.py`` on machines without CUDA."""

import torch
from mmengine.config import Config

from ...engine.strategies import init_cpu_process_group
from ...errors import ConfigError


def setup_cpu_distributed(cfg: Config) -> None:
    """Let ``--launcher pytorch`` or ``slurm`` run on machines without CUDA (gloo backend).

    mmengine 0.10's launchers call ``torch.cuda.set_device`` and wrap DDP with CUDA
    ``device_ids``; without a GPU we initialise the process group ourselves (mmengine then
    skips its own) and build DDP without device ids. A ``FlexibleRunner`` config's strategy
    (``FoldableFSDPStrategy``) builds its own wrapper.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher not in ('pytorch', 'slurm') or torch.cuda.is_available():
        return
    backend = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('backend', 'gloo')
    init_cpu_process_group(launcher, backend)
    wrapper = dict(
        type='MMDistributedDataParallel',
        broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False),
    )
    wrapper.update(cfg.get('model_wrapper_cfg') or {})
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper


def check_strategy(cfg: Config) -> None:
    """Refuse, in one line, a ``FlexibleRunner`` strategy that cannot run here: DeepSpeed when
    it is not installed or there is no CUDA, mmengine's ``FSDPStrategy`` without CUDA."""
    strategy = cfg.get('strategy') or {}
    kind = strategy.get('type') if isinstance(strategy, dict) else None
    kind = kind if isinstance(kind, str) else getattr(kind, '__name__', None)
    if kind == 'DeepSpeedStrategy':
        from ..optional import require

        require('deepspeed', tool='DeepSpeedStrategy')
        if not torch.cuda.is_available():
            raise ConfigError(
                'DeepSpeedStrategy needs CUDA here: on the CPU its ZeRO initialisation did not '
                'finish (docs/training.md); use FoldableFSDPStrategy'
            )
    if kind == 'FSDPStrategy' and not torch.cuda.is_available():
        raise ConfigError(
            "mmengine's FSDPStrategy needs CUDA (it calls torch.cuda.set_device); use "
            "strategy=dict(type='FoldableFSDPStrategy', ...), which also runs on the CPU"
        )
