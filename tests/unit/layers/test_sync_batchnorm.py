"""``sync_bn='torch'``: mmrepa's BatchNorms (channel-idle FFN, RepBN/PRepBN) convert to SyncBN,
``norm_eval`` still freezes them, and after mmengine's ``revert_sync_batchnorm`` (what test-time
tools do) the model folds exactly."""

import copy

import pytest
import torch
import torch.nn as nn
from mmengine.model import revert_sync_batchnorm
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, PRepBNSwin, RePaSwin
from tests.helpers import TINY_ARCH, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.

BUILDERS = {
    'repa_swin': lambda **kw: RePaSwin(arch=TINY_ARCH, window_size=4, **kw),
    'prepbn_swin': lambda **kw: PRepBNSwin(arch=TINY_ARCH, window_size=4, idle_ratio=0.5, **kw),
    'repa_caformer': lambda **kw: CAFormer(
        arch=dict(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64)), head_dim=16, idle_ratio=0.75, **kw
    ),
}


def batchnorm_names(model):
    return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)]


@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_sync_batchnorm_conversion_norm_eval_and_fold_after_revert(name):
    model = randomize_(BUILDERS[name](norm_eval=True)).double()
    names = batchnorm_names(model)
    assert names  # the FFN's (and RepBN's) BatchNorms
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model))
    assert [n for n, m in synced.named_modules() if isinstance(m, nn.SyncBatchNorm)] == names
    synced.train()
    assert all(not m.training for m in synced.modules() if isinstance(m, nn.SyncBatchNorm))

    reverted = revert_sync_batchnorm(synced).eval()
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in reverted.modules())
    assert batchnorm_names(reverted) == names
    x = torch.randn(1, 3, 45, 67, dtype=torch.float64)
    with torch.no_grad():
        ref = model.eval()(x)
        out = reparameterize(reverted)(x)
    assert not batchnorm_names(reverted)  # all folded away
    assert max((r - o).abs().max().item() for r, o in zip(ref, out)) < 1e-10
