"""tools/benchmark.py under the precision and compiler used in production: --amp, --channels-last,
--compile, applied to the unfolded and the folded model alike."""

import json
import os.path as osp

import pytest
import torch
import torch.nn as nn

from mmrepa import reparameterize
from mmrepa.backbones import PRepBNSwin, RePaSwin
from mmrepa.errors import ConfigError
from tests.helpers import ROOT, TINY_ARCH, randomize_, script_module

# RepOpt-VGG in RepVGG mode: convs only, so dynamo traces it in about a second
REPVGG = [
    osp.join(ROOT, 'configs', 'demo', 'repopt_vgg_shapes.py'),
    '--shape',
    '48',
    '48',
    '--cfg-options',
    'model.backbone.mode=repvgg',
    'model.backbone.scales=None',
]


@pytest.fixture(scope='module')
def benchmark():
    return script_module('tools/benchmark.py')


class Recorder(nn.Module):
    """A part that records the dtype it computes in; a post-processing step that needs fp32."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        y = self.fc(x)
        self.seen.append(y.dtype)
        return y


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone, self.bbox_head = Recorder(), Recorder()

    def test_step(self, x):
        out = self.bbox_head(self.backbone(x))
        assert out.dtype == torch.float32, 'post-processing must get float32'
        return out


@pytest.mark.parametrize('amp, dtype', [('bf16', torch.bfloat16), ('fp16', torch.float16)])
def test_network_runs_under_autocast_and_post_processing_in_float32(benchmark, amp, dtype):
    model = Detector()
    context = benchmark.autocast_context(torch.device('cpu'), amp)
    with benchmark.network_under_autocast([model], context):
        model.test_step(torch.randn(2, 4))
    assert model.backbone.seen == model.bbox_head.seen == [dtype]
    model.test_step(torch.randn(2, 4))  # restored: float32 again
    assert model.backbone.seen[-1] == torch.float32


def test_an_unsupported_amp_is_refused_with_the_reason(benchmark, monkeypatch):
    monkeypatch.setattr(torch.amp, 'is_autocast_available', lambda device_type: False)
    with pytest.raises(ConfigError, match='--amp bf16: torch has no autocast for cpu'):
        benchmark.autocast_context(torch.device('cpu'), 'bf16')
    with pytest.raises(SystemExit, match='tools/benchmark.py: --amp fp16: torch has no autocast'):
        benchmark.main([*REPVGG, '--amp', 'fp16', '--repeat', '1'])


def test_compile_time_is_reported_apart_and_outputs_are_unchanged(benchmark):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    timed = benchmark.Compiled(module, 'eager')
    x = torch.randn(1, 3, 8, 8)
    assert timed.compile_seconds is None
    assert torch.equal(timed(x), module(x))
    first = timed.compile_seconds
    assert first > 0
    timed(x)
    assert timed.compile_seconds == first  # only the first call is compile time


def test_every_setting_applies_to_both_models(benchmark, tmp_path):
    out = tmp_path / 'result.json'
    benchmark.main(
        [
            *REPVGG,
            '--repeat',
            '1',
            '--warmup',
            '0',
            '--amp',
            'bf16',
            '--channels-last',
            '--compile',
            '--compile-backend',
            'eager',
            '--out',
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert (result['amp'], result['channels_last'], result['compile']) == ('bf16', True, True)
    assert set(result['compile_seconds']) == {'before', 'after'}
    assert all(t > 0 for t in result['compile_seconds'].values())
    for scope in ('backbone', 'test_step'):
        assert result['scopes'][scope]['before']['median_ms'] > 0
        assert result['scopes'][scope]['after']['median_ms'] > 0


# two blocks in the first stage: one with plain, one with shifted windows
SWIN_ARCH = dict(TINY_ARCH, depths=(2, 1, 1, 1))


# both Swins share the window layout: RePa-Swin as trained, PRepBN-Swin folded
@pytest.mark.parametrize(
    'build, folded',
    [
        (lambda: RePaSwin(arch=SWIN_ARCH, window_size=4, idle_ratio=0.75, ffn_norm='BN'), False),
        (lambda: PRepBNSwin(arch=SWIN_ARCH, window_size=4), True),
    ],
)
def test_windowed_swin_compiles_without_graph_breaks(build, folded):
    """The window layout has no value-dependent shapes (it used boolean indexing: 15 graph
    breaks in the demo RePa-Swin, and --compile gained nothing); 13 x 19 needs padding and
    the shifted windows wrap."""
    import torch._dynamo as dynamo

    model = randomize_(build()).eval()
    if folded:
        reparameterize(model)
    x = torch.randn(1, 3, 52, 76)
    with torch.no_grad():
        explained = dynamo.explain(model)(x)
    dynamo.reset()
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
