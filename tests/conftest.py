import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

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


def shapes_cfg_options(data: str) -> list:
    """``--cfg-options`` that point the demo detector config at a generated shapes set in
    ``data`` (ending in '/'), without worker processes; an untrained detector still detects."""
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [f'{loader}.dataset.data_root={data}', f'{loader}.num_workers=0',
                    f'{loader}.persistent_workers=False']
    for ev in ('val_evaluator', 'test_evaluator'):
        options.append(f'{ev}.ann_file={data}annotations/val.json')
    options.append('model.test_cfg.score_thr=0.0')
    return options


def max_abs_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    return (a - b).abs().max().item()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
