"""Distributed runs of ``tools/train.py`` and ``tools/test.py`` on machines without CUDA."""

import os
import subprocess

import torch
from mmengine.config import Config


def _slurm_to_torch_env() -> None:
    """The rendezvous variables torch reads, from Slurm's (as mmengine's slurm launcher)."""
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
    os.environ.setdefault('MASTER_PORT', '29500')
    if 'MASTER_ADDR' not in os.environ:
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {os.environ["SLURM_NODELIST"]} | head -n1'
        )


def setup_cpu_distributed(cfg: Config) -> None:
    """Let ``--launcher pytorch`` or ``slurm`` run on machines without CUDA (gloo backend).

    mmengine 0.10's launchers call ``torch.cuda.set_device`` and wrap DDP with CUDA
    ``device_ids``; without a GPU we initialise the process group ourselves (mmengine then
    skips its own) and build DDP without device ids.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher not in ('pytorch', 'slurm') or torch.cuda.is_available():
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        if launcher == 'slurm':
            _slurm_to_torch_env()
        backend = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('backend', 'gloo')
        dist.init_process_group(backend='gloo' if backend == 'nccl' else backend)
    wrapper = dict(
        type='MMDistributedDataParallel',
        broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False),
    )
    wrapper.update(cfg.get('model_wrapper_cfg') or {})
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
