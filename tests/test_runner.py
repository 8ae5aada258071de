"""End to end with mmengine's Runner: checkpoints under weights_only, the reparameterize hook."""
import io
import os.path as osp
import pickle

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmrepa  # noqa: F401
from mmrepa.datasets import make_shapes_coco

# module-scoped fixtures: keep this file's tests on one xdist worker
pytestmark = pytest.mark.xdist_group('test_runner')

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def demo_cfg(data_root, work_dir, **overrides):
    cfg = Config.fromfile(DEMO)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].num_workers = 0
        cfg[loader].persistent_workers = False
    cfg.train_dataloader.batch_size = 4
    for ev in ('val_evaluator', 'test_evaluator'):
        cfg[ev].ann_file = osp.join(data_root, 'annotations/val.json')
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=1)
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=0, deterministic=True)
    cfg.merge_from_dict(overrides)
    return cfg


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A demo detector trained for 2 short epochs; returns (data_root, checkpoint)."""
    base = tmp_path_factory.mktemp('runner')
    data_root = make_shapes_coco(str(base / 'data'), num_train=8, num_val=4, size=64) + '/'
    cfg = demo_cfg(data_root, str(base / 'train'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    # validation during training saw the unfolded model and left it unfolded
    assert hasattr(runner.model.backbone.stages[0].blocks[0].ffn, 'fc1')
    return data_root, osp.join(cfg.work_dir, 'epoch_2.pth')


class _Reduces:
    """Pickles as ``fn(*args)``."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _load_pickled(obj):
    buf = io.BytesIO()
    torch.save({'x': obj}, buf, pickle_protocol=2)
    buf.seek(0)
    return torch.load(buf)  # torch's default: weights_only=True


def test_checkpoint_loads_with_weights_only(trained):
    _, ckpt = trained
    state = torch.load(ckpt, map_location='cpu')
    assert 'message_hub' in state and 'optimizer' in state


def test_the_allow_list_is_not_a_switch_off():
    with pytest.raises(pickle.UnpicklingError, match='Unsupported global'):
        _load_pickled(_Reduces(print, 'pwned'))
    from mmengine.logging.history_buffer import HistoryBuffer
    assert _load_pickled(_Reduces(getattr, HistoryBuffer, 'mean'))['x'] is HistoryBuffer.mean
    with pytest.raises(pickle.UnpicklingError, match="getattr.*'__init__'"):
        _load_pickled(_Reduces(getattr, HistoryBuffer, '__init__'))


def test_resume_continues_from_the_checkpoint(trained, tmp_path):
    data_root, ckpt = trained
    cfg = demo_cfg(data_root, str(tmp_path), train_cfg=dict(max_epochs=3))
    cfg.resume, cfg.load_from = True, ckpt
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.epoch == 3 and runner.iter == 6


def run_test(data_root, ckpt, work_dir, hooks=()):
    cfg = demo_cfg(data_root, work_dir, load_from=ckpt)
    cfg.custom_hooks = list(hooks)
    runner = Runner.from_cfg(cfg)
    return runner, runner.test()


def test_reparameterize_hook_keeps_the_metric_and_restores_the_model(trained, tmp_path):
    data_root, ckpt = trained
    _, plain = run_test(data_root, ckpt, str(tmp_path / 'plain'))
    hook = dict(type='ReparameterizeHook', verify=True, measure_latency=True, num_batches=2,
                warmup=1)
    runner, folded = run_test(data_root, ckpt, str(tmp_path / 'folded'), [hook])
    assert folded == plain
    rep = next(h for h in runner.hooks if type(h).__name__ == 'ReparameterizeHook')
    r = rep.results
    assert r['verify_rel_error'] < 1e-4
    assert r['params_after'] < r['params_before']
    assert r['ms_per_image_before'] > 0 and r['ms_per_image_after'] > 0
    assert hasattr(runner.model.backbone.stages[0].blocks[0].ffn, 'fc1')  # restored


def test_reparameterize_hook_folds_after_ema(trained, tmp_path):
    data_root, ckpt = trained
    ema = dict(type='EMAHook', momentum=0.5)
    # a checkpoint with EMA weights: train one more epoch with the EMA hook
    cfg = demo_cfg(data_root, str(tmp_path / 'ema_train'), train_cfg=dict(max_epochs=1),
                   load_from=ckpt)
    cfg.custom_hooks = [ema]
    Runner.from_cfg(cfg).train()
    ema_ckpt = str(tmp_path / 'ema_train' / 'epoch_1.pth')
    assert 'ema_state_dict' in torch.load(ema_ckpt, map_location='cpu')
    _, with_ema = run_test(data_root, ema_ckpt, str(tmp_path / 'a'), [ema])
    runner, both = run_test(data_root, ema_ckpt, str(tmp_path / 'b'),
                            [ema, dict(type='ReparameterizeHook')])
    assert both == with_ema


def test_verify_catches_a_wrong_fold(trained, tmp_path, monkeypatch):
    data_root, ckpt = trained
    from mmrepa.layers import ChannelIdleFFN
    original = ChannelIdleFFN.reparameterize

    def broken(self):
        original(self)
        with torch.no_grad():
            self.in_proj.bias.add_(1.0)

    monkeypatch.setattr(ChannelIdleFFN, 'reparameterize', broken)
    with pytest.raises(RuntimeError, match='folded model disagrees'):
        run_test(data_root, ckpt, str(tmp_path), [dict(type='ReparameterizeHook')])


PREPBN_BACKBONE = dict(
    type='PRepBNSwin', arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
    window_size=4, out_indices=(1, 2, 3), idle_ratio=0.5, drop_path_rate=0., init_cfg=None)


def _train(data_root, work_dir, max_epochs, resume_from=None, prepbn=False):
    cfg = demo_cfg(data_root, work_dir, train_cfg=dict(max_epochs=max_epochs, val_interval=100))
    if prepbn:  # lambda decays from iteration 2 over 20: mid-decay when compared. No drop path:
        # mmengine reseeds rather than restoring the RNG on resume
        cfg.model.backbone = PREPBN_BACKBONE
        cfg.model.neck.in_channels = [32, 64, 128]
        cfg.custom_hooks = [dict(type='PRepBNScheduleHook', warmup_iters=2, decay_iters=20)]
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.dataset.pipeline[3].prob = 0.0  # no random flips: runs must agree
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
                                end=8)]
    if resume_from:
        cfg.resume, cfg.load_from = True, resume_from
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


@pytest.mark.parametrize('prepbn', [False, True], ids=['repa_swin', 'prepbn_swin'])
def test_resume_is_exact(trained, tmp_path, prepbn):
    data_root, _ = trained
    straight = _train(data_root, str(tmp_path / 'straight'), 4, prepbn=prepbn)
    _train(data_root, str(tmp_path / 'first'), 2, prepbn=prepbn)
    resumed = _train(data_root, str(tmp_path / 'second'), 4,
                     resume_from=str(tmp_path / 'first' / 'epoch_2.pth'), prepbn=prepbn)
    assert resumed.iter == straight.iter == 16
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert any('running_var' in k for k in a)
    if prepbn:  # lambda is state: compared below with everything else
        lams = [v.item() for k, v in b.items() if k.endswith('.lam')]
        # set before the last iteration (index 15)
        assert lams and all(v == pytest.approx(1 - (15 - 2) / 20) for v in lams)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # weights and BN statistics
    sa = straight.optim_wrapper.optimizer.state_dict()
    sb = resumed.optim_wrapper.optimizer.state_dict()
    for i, state in sa['state'].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb['state'][i][name]))
    assert [g['lr'] for g in sa['param_groups']] == [g['lr'] for g in sb['param_groups']]
