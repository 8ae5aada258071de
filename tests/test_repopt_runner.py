"""RepOpt-VGG trained by mmengine's Runner: the rule of initialization runs once, from
scratch, after the optimizer is built and before any weights are loaded; resuming is bit-exact;
``load_from`` is never re-initialized."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmrepa  # noqa: F401

from .test_pretrain_handoff import write_images
from .test_repopt_vgg import _random_scales

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'repopt_vgg_shapes.py')
ARCH = dict(depths=(1, 2, 1, 1), widths=(8, 16, 16, 32), stem_width=8)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('repopt_runner')
    data = write_images(str(tmp / 'data'), count=8)
    from mmrepa.backbones import RepOptVGG
    scales = str(tmp / 'scales.pth')
    torch.save(_random_scales(RepOptVGG(ARCH), seed=2), scales)
    return tmp, data, scales


def config(setup, work_dir, iters=4, **extra):
    """The demo's target config, tiny, deterministic (no shuffling or random transforms)."""
    tmp, data, scales = setup
    cfg = Config.fromfile(DEMO)
    steps = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(24, 24)),
             dict(type='PackInputs')]
    loader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  dataset=dict(type='CustomDataset', data_root=data, data_prefix='train',
                               pipeline=steps))
    cfg.merge_from_dict(dict(
        work_dir=str(work_dir),
        model=dict(backbone=dict(arch=ARCH, scales=scales), head=dict(in_channels=32)),
        train_dataloader=loader,
        train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=iters),
        val_dataloader=None, val_cfg=None, val_evaluator=None,
        test_dataloader=None, test_cfg=None, test_evaluator=None,
        param_scheduler=[dict(type='CosineAnnealingLR', by_epoch=False, T_max=iters)],
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=3),
                           logger=dict(interval=1)),
        randomness=dict(seed=0, deterministic=True),
        **extra))
    cfg.train_dataloader.persistent_workers = False
    return cfg


def train(cfg):
    runner = Runner.from_cfg(cfg)
    seen = {}

    def first_batch(module, args):  # the weights the first training step sees
        if not seen:
            seen.update({k: v.clone() for k, v in module.state_dict().items()})

    handle = runner.model.register_forward_pre_hook(first_batch)
    runner.train()
    handle.remove()
    return runner.model, seen


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_first_step_sees_the_rule_of_initialization_and_resume_is_exact(setup, tmp_path):
    model, first = train(config(setup, tmp_path / 'full'))
    # the first step saw the CSLA-equivalent start: BN fresh, kernels = s*K0 + ... (not the
    # constructor's default init, which init_weights replaced after the optimizer was built)
    assert torch.equal(first['backbone.stage0.bn.weight'],
                       torch.ones_like(first['backbone.stage0.bn.weight']))
    assert int(first['backbone.stage1.0.bn.num_batches_tracked']) == 0
    full = state(model)

    # the same run resumed from its checkpoint after 2 iterations
    cfg = config(setup, tmp_path / 'again', iters=4,
                 resume=True, load_from=str(tmp_path / 'full' / 'iter_2.pth'))
    model2, seen = train(cfg)
    assert int(seen['backbone.stage1.0.bn.num_batches_tracked']) == 2  # not re-initialized
    for k, v in full.items():
        assert torch.equal(state(model2)[k], v), k


def test_load_from_is_not_reinitialized(setup, tmp_path):
    model, _ = train(config(setup, tmp_path / 'a', iters=2))
    trained = state(model)
    _, seen = train(config(setup, tmp_path / 'b', iters=2,
                           load_from=str(tmp_path / 'a' / 'iter_2.pth')))
    for k, v in trained.items():
        assert torch.equal(seen[k], v), k
