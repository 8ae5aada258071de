"""RepOpt-VGG trained by mmengine's Runner: the rule of initialization runs once, from
scratch, after the optimizer is built and before any weights are loaded; resuming is bit-exact;
``load_from`` is never re-initialized."""

import os.path as osp

import pytest
import torch
from mmengine.runner import Runner

import mmrepa  # noqa: F401
from mmrepa.apis import load_config
from mmrepa.backbones.repopt_vgg.blocks import _random_kernel
from tests.helpers import ROOT, random_scales, write_images

DEMO = osp.join(ROOT, 'configs', 'demo', 'repopt_vgg_shapes.py')
ARCH = dict(depths=(1, 2, 1, 1), widths=(8, 16, 16, 32), stem_width=8)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('repopt_runner')
    data = write_images(str(tmp / 'data'), count=8)
    from mmrepa.backbones import RepOptVGG

    scales = str(tmp / 'scales.pth')
    torch.save(random_scales(RepOptVGG(ARCH), seed=2), scales)
    return tmp, data, scales


def config(setup, work_dir, iters=4, **extra):
    """The demo's target config, tiny, deterministic (no shuffling or random transforms)."""
    tmp, data, scales = setup
    cfg = load_config(DEMO)
    steps = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(24, 24)),
        dict(type='PackInputs'),
    ]
    loader = dict(
        batch_size=4,
        num_workers=0,
        persistent_workers=False,
        # mmengine's iteration loop sleeps 2 s at the end of another sampler's epoch
        sampler=dict(type='InfiniteSampler', shuffle=False),
        dataset=dict(type='CustomDataset', data_root=data, data_prefix='train', pipeline=steps),
    )
    cfg.merge_from_dict(
        dict(
            work_dir=str(work_dir),
            model=dict(backbone=dict(arch=ARCH, scales=scales), head=dict(in_channels=32)),
            train_dataloader=loader,
            train_cfg=dict(_delete_=True, type='IterBasedTrainLoop', max_iters=iters),
            val_dataloader=None,
            val_cfg=None,
            val_evaluator=None,
            test_dataloader=None,
            test_cfg=None,
            test_evaluator=None,
            param_scheduler=[dict(type='CosineAnnealingLR', by_epoch=False, T_max=iters)],
            default_hooks=dict(
                checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=3),
                logger=dict(interval=1),
            ),
            randomness=dict(seed=0, deterministic=True),
            **extra,
        )
    )
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


def csla_start(first, rng_state):
    """The kernels of a CSLA block at its start, from the constants the first step saw and the
    random K0 (C_out, C_in, 3, 3), P0 (C_out, C_in, 1, 1) drawn layer by layer (PyTorch's
    Conv2d default, U(+-1/sqrt(fan_in))) from the RNG state init_weights began with:
    W = s * K0 + t * P0 at the centre tap + i on the centre diagonal (identity layers)."""
    g = torch.Generator()
    g.set_state(rng_state)
    names = ['stage0'] + [
        f'stage{k + 1}.{j}' for k, depth in enumerate(ARCH['depths']) for j in range(depth)
    ]
    out = {}
    for name in names:
        shape = first[f'backbone.{name}.conv.weight'].shape
        k0 = _random_kernel(shape, 'torch', g)
        p0 = _random_kernel((*shape[:2], 1, 1), 'torch', g)
        s, t, i = (
            first[f'backbone.{name}.{key}'] for key in ('scale_conv', 'scale_1x1', 'scale_identity')
        )
        s, t, i, k0, p0 = (v.double() for v in (s, t, i, k0, p0))
        w = s.view(-1, 1, 1, 1) * k0
        size = w.abs()  # the sum of the terms' magnitudes, for the rounding bound
        w[:, :, 1, 1] += t.view(-1, 1) * p0[:, :, 0, 0]
        size[:, :, 1, 1] += (t.view(-1, 1) * p0[:, :, 0, 0]).abs()
        # the identity branch: every layer but the stem and each stage's (stride-2) first
        if name != 'stage0' and not name.endswith('.0'):
            for c in range(shape[0]):
                w[c, c, 1, 1] += i[c]
                size[c, c, 1, 1] += i[c].abs()
        out[name] = w, size
    return out


def test_first_step_sees_the_rule_of_initialization_and_resume_is_exact(
    setup, tmp_path, monkeypatch
):
    from mmrepa.backbones import RepOptVGG

    rng = []
    init_weights = RepOptVGG.init_weights

    def record_rng(self):  # the Runner calls it after building the optimizer
        rng.append(torch.get_rng_state())
        return init_weights(self)

    monkeypatch.setattr(RepOptVGG, 'init_weights', record_rng)
    model, first = train(config(setup, tmp_path / 'full'))
    monkeypatch.undo()
    assert len(rng) == 1
    # the first step saw the CSLA-equivalent start with the constants of the scales file,
    # not the constructor's default init (which init_weights replaced after the optimizer
    # was built), and fresh BatchNorms
    scales = torch.load(setup[2], weights_only=True)
    expected = csla_start(first, rng[0])
    # float64 reference: the model's float32 sum of three products rounds at most 3 times per
    # element, each by u = 2^-24 of the running magnitude: gamma_3 = 3u / (1 - 3u) of `size`
    gamma3 = 3 * 2.0**-24 / (1 - 3 * 2.0**-24)
    for name, (w, size) in expected.items():
        assert torch.equal(
            first[f'backbone.{name}.scale_conv'], scales[f'{name}.scale_conv.weight']
        ), name
        error = (first[f'backbone.{name}.conv.weight'].double() - w).abs()
        assert (error <= gamma3 * size).all(), f'{name}: not the CSLA-equivalent start'
        assert torch.equal(
            first[f'backbone.{name}.bn.weight'],
            torch.ones_like(first[f'backbone.{name}.bn.weight']),
        )
        assert int(first[f'backbone.{name}.bn.num_batches_tracked']) == 0
    full = state(model)

    # the same run resumed from its checkpoint after 2 iterations
    cfg = config(
        setup,
        tmp_path / 'again',
        iters=4,
        resume=True,
        load_from=str(tmp_path / 'full' / 'iter_2.pth'),
    )
    model2, seen = train(cfg)
    assert int(seen['backbone.stage1.0.bn.num_batches_tracked']) == 2  # not re-initialized
    for k, v in full.items():
        assert torch.equal(state(model2)[k], v), k


def test_load_from_is_not_reinitialized(setup, tmp_path):
    model, _ = train(config(setup, tmp_path / 'a', iters=2))
    trained = state(model)
    _, seen = train(
        config(setup, tmp_path / 'b', iters=2, load_from=str(tmp_path / 'a' / 'iter_2.pth'))
    )
    for k, v in trained.items():
        assert torch.equal(seen[k], v), k


def test_a_target_with_se_blocks_starts_from_the_rule_and_resumes_exactly(
    setup, tmp_path, monkeypatch
):
    """RepOpt-VGG-L2‡'s route (``se=True``): the rule of initialization sets the kernels as
    without SE blocks (drawing the same random numbers) and leaves the SE weights to their
    construction; they train with the kernels; resume is bit-exact."""
    from mmrepa.backbones import RepOptVGG

    def se_config(work_dir, **extra):
        cfg = config(setup, work_dir, **extra)
        cfg.merge_from_dict({'model.backbone.se': True})
        return cfg

    rng, built = [], []
    init_weights = RepOptVGG.init_weights

    def record(self):
        rng.append(torch.get_rng_state())
        built.append({k: v.clone() for k, v in self.state_dict().items() if 'post_se' in k})
        return init_weights(self)

    monkeypatch.setattr(RepOptVGG, 'init_weights', record)
    model, first = train(se_config(tmp_path / 'full'))
    monkeypatch.undo()
    gamma3 = 3 * 2.0**-24 / (1 - 3 * 2.0**-24)  # as in the test above
    for name, (w, size) in csla_start(first, rng[0]).items():
        error = (first[f'backbone.{name}.conv.weight'].double() - w).abs()
        assert (error <= gamma3 * size).all(), f'{name}: not the CSLA-equivalent start'
    assert built[0], 'no SE block was built'
    full = state(model)
    for k, v in built[0].items():
        assert torch.equal(first[f'backbone.{k}'], v), k  # init_weights left them alone
        if k.endswith('up.bias'):  # always reached by the gradient (tiny `down`s may be dead)
            assert not torch.equal(full[f'backbone.{k}'], v), k  # and they trained
    model2, seen = train(
        se_config(tmp_path / 'again', resume=True, load_from=str(tmp_path / 'full' / 'iter_2.pth'))
    )
    assert int(seen['backbone.stage1.0.bn.num_batches_tracked']) == 2
    for k, v in full.items():
        assert torch.equal(state(model2)[k], v), k
