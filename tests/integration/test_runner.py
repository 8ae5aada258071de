"""End to end with mmengine's Runner: checkpoints under weights_only, the reparameterize hook."""

import copy
import io
import pickle

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmrepa
from tests.helpers import demo_cfg, max_relative

# module-scoped fixtures: keep this file's tests on one xdist worker


@pytest.fixture(scope='module')
def trained(demo_detector):
    """The demo detector trained for 2 short epochs; returns (data_root, checkpoint)."""
    data_root, checkpoints = demo_detector
    return data_root, checkpoints[2]


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

    # mmengine checkpoints pickle HistoryBuffer's statistics methods as getattr calls; under
    # that name mmrepa registers a function that gives their names, never an attribute
    assert _load_pickled(_Reduces(getattr, HistoryBuffer, 'mean'))['x'] == 'HistoryBuffer.mean'
    with pytest.raises(pickle.UnpicklingError, match="getattr.*'__init__'"):
        _load_pickled(_Reduces(getattr, HistoryBuffer, '__init__'))


def test_resume_continues_from_the_checkpoint(trained, tmp_path):
    data_root, ckpt = trained
    cfg = demo_cfg(data_root, str(tmp_path), train_cfg=dict(max_epochs=3))
    cfg.resume, cfg.load_from = True, ckpt
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.epoch == 3 and runner.iter == 6


def make_runner(data_root, ckpt, work_dir, hooks=(), **overrides):
    cfg = demo_cfg(data_root, work_dir, load_from=ckpt, **overrides)
    cfg.custom_hooks = list(hooks)
    return Runner.from_cfg(cfg)


def run_test(data_root, ckpt, work_dir, hooks=(), **overrides):
    runner = make_runner(data_root, ckpt, work_dir, hooks, **overrides)
    return runner, runner.test()


def the_hook(runner):
    from mmrepa.engine import ReparameterizeHook

    return next(h for h in runner.hooks if isinstance(h, ReparameterizeHook))


def is_folded(model):
    return not hasattr(model.backbone.stages[0].blocks[0].ffn, 'fc1')


def tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = [out[k] for k in sorted(out)]
    return [t for o in out for t in tensors(o)]


class ModelUnderTest(Hook):
    """Records, on the first test batch, the model under test and its outputs in tensor mode
    (the detector's head outputs), and what ``probe`` returns at every test iteration."""

    priority = 'LOWEST'

    def __init__(self, probe=None):
        self.probe, self.seen = probe, []
        self.state = self.outputs = self.folded = None

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        if self.probe is not None:
            self.seen.append(self.probe(runner))
        if batch_idx == 0:
            model = runner.model
            self.folded = is_folded(model)
            self.state = {k: v.clone() for k, v in model.state_dict().items()}
            with torch.no_grad():
                data = model.data_preprocessor(copy.deepcopy(data_batch), False)
                self.outputs = tensors(model(**data, mode='tensor'))


def test_reparameterize_hook_tests_the_folded_model_and_restores_it(trained, tmp_path):
    data_root, ckpt = trained
    plain = ModelUnderTest()
    runner = make_runner(data_root, ckpt, str(tmp_path / 'plain'))
    runner.register_hook(plain)
    runner.test()
    folded = ModelUnderTest()
    runner = make_runner(
        data_root, ckpt, str(tmp_path / 'folded'), [dict(type='ReparameterizeHook')]
    )
    runner.register_hook(folded)
    runner.test()
    assert folded.folded and not plain.folded
    assert len(plain.outputs) == len(folded.outputs) > 1
    assert max_relative(folded.outputs, plain.outputs) < 1e-4  # every head output
    r = the_hook(runner).results
    assert r['verify_rel_error'] < 1e-4
    assert r['params_after'] < r['params_before']
    assert not is_folded(runner.model)  # restored


def test_latency_is_per_image_of_each_batch(trained, tmp_path, monkeypatch):
    """Batches of 3 and 1 images; a fake clock charges 4 ms per image before folding and 2 ms
    after, so every batch's time divided by its own size is exactly that."""
    data_root, ckpt = trained
    from mmrepa.utils import latency

    calls = []

    def fake_time_call(fn, device=None):
        images = len(fn())  # test_step returns one data sample per image
        calls.append(images)
        return (4.0 if len(calls) % 2 else 2.0) * images  # before, after, before, ...

    monkeypatch.setattr(latency, 'time_call', fake_time_call)
    hook = dict(
        type='ReparameterizeHook', verify=False, measure_latency=True, num_batches=2, warmup=1
    )
    runner, _ = run_test(
        data_root, ckpt, str(tmp_path), [hook], test_dataloader=dict(batch_size=3)
    )  # 4 images: batches of 3 and 1
    assert sorted(calls) == [1, 1, 3, 3]
    r = the_hook(runner).results
    assert r['ms_per_image_before'] == pytest.approx(4.0)
    assert r['ms_per_image_after'] == pytest.approx(2.0)
    assert r['change_percent'] == pytest.approx(-50.0)


def test_the_original_model_waits_on_the_cpu(trained, tmp_path, monkeypatch):
    """As if the model were on an accelerator: it moves to the CPU while the folded copy is
    tested, and back after."""
    data_root, ckpt = trained
    from mmrepa.engine.hooks import reparameterize_hook

    accelerator, moves = torch.device('cuda', 1), []
    monkeypatch.setattr(reparameterize_hook, '_device_of', lambda model: accelerator)
    monkeypatch.setattr(
        reparameterize_hook, '_move', lambda model, device: moves.append((model, device))
    )
    recorder = ModelUnderTest(probe=lambda runner: list(moves))
    runner = make_runner(data_root, ckpt, str(tmp_path), [dict(type='ReparameterizeHook')])
    runner.register_hook(recorder)
    original = runner.model
    runner.test()
    cpu = torch.device('cpu')
    assert recorder.folded and recorder.seen == [[(original, cpu)]] * 4
    assert moves == [(original, cpu), (original, accelerator)]
    assert runner.model is original


class Fails(Hook):
    priority = 'LOWEST'

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if batch_idx == 1:
            raise RuntimeError('failed during the test')


@pytest.mark.parametrize('loop', ['FoldedTestLoop', 'TestLoop'])
@pytest.mark.parametrize('where', ['iteration', 'evaluator'])
def test_the_original_model_comes_back_when_testing_fails(
    trained, tmp_path, monkeypatch, where, loop
):
    """FoldedTestLoop restores the original model when the test raises; mmengine's TestLoop
    runs no hook then, and leaves the folded copy (ReparameterizeHook's documented limit)."""
    data_root, ckpt = trained
    if where == 'evaluator':
        from mmengine.evaluator import Evaluator

        def evaluate(self, size):
            raise RuntimeError('failed during the test')

        monkeypatch.setattr(Evaluator, 'evaluate', evaluate)
    runner = make_runner(
        data_root,
        ckpt,
        str(tmp_path),
        [dict(type='ReparameterizeHook')],
        test_cfg=dict(type=loop),
    )
    if where == 'iteration':
        runner.register_hook(Fails())
    original = runner.model
    with pytest.raises(RuntimeError, match='failed during the test'):
        runner.test()
    if loop == 'FoldedTestLoop':
        assert runner.model is original and not is_folded(runner.model)
    else:
        assert runner.model is not original and is_folded(runner.model)


def test_reparameterize_hook_folds_the_ema_weights(trained, tmp_path):
    """Train with EMA, then test the resumed run (its model holds the trained weights, EMA the
    averages): the folded model tested is the fold of the averages."""
    data_root, ckpt = trained
    ema = dict(type='EMAHook', momentum=0.5)
    cfg = demo_cfg(data_root, str(tmp_path / 'train'), train_cfg=dict(max_epochs=1), load_from=ckpt)
    cfg.custom_hooks = [ema]
    Runner.from_cfg(cfg).train()
    ema_ckpt = torch.load(str(tmp_path / 'train' / 'epoch_1.pth'), map_location='cpu')
    # in a resumed run (unlike one that loads the checkpoint) model and EMA hold different
    # weights; a run that trained and then tests does not help: EMAHook.before_run copies the
    # model into a new EMA before testing
    recorder = ModelUnderTest()
    runner = make_runner(
        data_root,
        str(tmp_path / 'train' / 'epoch_1.pth'),
        str(tmp_path / 'test'),
        [ema, dict(type='ReparameterizeHook')],
        resume=True,
    )
    runner.register_hook(recorder)
    runner.test()

    def folded_with(state):
        model = copy.deepcopy(runner.model)
        model.load_state_dict(state)
        return mmrepa.reparameterize(model.eval()).state_dict()

    averaged = folded_with(ema_ckpt['state_dict'])  # EMAHook saves the averages there
    trained_weights = folded_with(
        {
            k[len('module.') :]: v
            for k, v in ema_ckpt['ema_state_dict'].items()
            if k.startswith('module.')
        }
    )
    assert recorder.folded and recorder.state.keys() == averaged.keys()
    k = 'neck.fpn_convs.0.conv.weight'
    assert not torch.allclose(averaged[k], trained_weights[k])  # the test can tell them apart
    # the same fold of the same float32 weights in one process: the same bits
    for k, v in averaged.items():
        assert torch.equal(recorder.state[k], v), k
    assert not is_folded(runner.model)


def test_verify_catches_a_wrong_fold(trained, tmp_path, monkeypatch):
    data_root, ckpt = trained
    from mmrepa.layers import ChannelIdleFFN

    original = ChannelIdleFFN.reparameterize

    def broken(self, policy=None):
        original(self, policy)
        with torch.no_grad():
            self.in_proj.bias.add_(1.0)

    monkeypatch.setattr(ChannelIdleFFN, 'reparameterize', broken)
    with pytest.raises(RuntimeError, match='folded model disagrees'):
        run_test(data_root, ckpt, str(tmp_path), [dict(type='ReparameterizeHook')])


def test_verify_checks_the_whole_model_not_only_the_backbone(trained, tmp_path, monkeypatch):
    """An error after the backbone (here: in the box regression head of the folded copy) is
    caught too."""
    data_root, ckpt = trained
    from mmrepa.engine.hooks import reparameterize_hook

    fold = reparameterize_hook.fold_model

    def fold_and_break_the_head(model, **kwargs):
        report = fold(model, **kwargs)
        with torch.no_grad():
            bias = report.model.bbox_head.retina_reg.bias
            bias.add_(1e-3 * (bias.abs().max() + 1))
        return report

    monkeypatch.setattr(reparameterize_hook, 'fold_model', fold_and_break_the_head)
    with pytest.raises(RuntimeError, match=r'folded model disagrees.*output\[1\]'):
        run_test(data_root, ckpt, str(tmp_path), [dict(type='ReparameterizeHook')])


PREPBN_BACKBONE = dict(
    type='PRepBNSwin',
    arch=dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)),
    window_size=4,
    out_indices=(1, 2, 3),
    idle_ratio=0.5,
    drop_path_rate=0.0,
    init_cfg=None,
)


def _train(data_root, work_dir, max_epochs, resume_from=None, prepbn=False):
    cfg = demo_cfg(data_root, work_dir, train_cfg=dict(max_epochs=max_epochs, val_interval=100))
    if prepbn:  # lambda decays from iteration 2 over 20: mid-decay at the resume and when
        # compared. No drop path: mmengine reseeds rather than restoring the RNG on resume
        cfg.model.backbone = PREPBN_BACKBONE
        cfg.model.neck.in_channels = [32, 64, 128]
        cfg.custom_hooks = [dict(type='PRepBNScheduleHook', warmup_iters=2, decay_iters=20)]
    cfg.train_dataloader.batch_size = 2
    cfg.train_dataloader.dataset.pipeline[3].prob = 0.0  # no random flips: runs must agree
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=8)]
    if resume_from:
        cfg.resume, cfg.load_from = True, resume_from
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


@pytest.mark.parametrize('prepbn', [False, True], ids=['repa_swin', 'prepbn_swin'])
def test_resume_is_exact(trained, tmp_path, prepbn):
    data_root, _ = trained
    # 2 epochs of 4 iterations, resumed after the first: mid-warmup of the learning rate
    straight = _train(data_root, str(tmp_path / 'straight'), 2, prepbn=prepbn)
    _train(data_root, str(tmp_path / 'first'), 1, prepbn=prepbn)
    resumed = _train(
        data_root,
        str(tmp_path / 'second'),
        2,
        resume_from=str(tmp_path / 'first' / 'epoch_1.pth'),
        prepbn=prepbn,
    )
    assert resumed.iter == straight.iter == 8
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert any('running_var' in k for k in a)
    if prepbn:  # lambda is state: compared below with everything else
        lams = [v.item() for k, v in b.items() if k.endswith('.lam')]
        # set before the last iteration (index 7)
        assert lams and all(v == pytest.approx(1 - (7 - 2) / 20) for v in lams)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # weights and BN statistics
    sa = straight.optim_wrapper.optimizer.state_dict()
    sb = resumed.optim_wrapper.optimizer.state_dict()
    for i, state in sa['state'].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb['state'][i][name]))
    assert [g['lr'] for g in sa['param_groups']] == [g['lr'] for g in sb['param_groups']]
