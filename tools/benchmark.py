"""Measure what folding buys: the unfolded and the folded model, interleaved, in one run.

    python tools/benchmark.py CONFIG [--checkpoint CKPT] [--shape H W] [--batch N]
        [--repeat R] [--warmup W] [--backbone-only] [--onnx] [--amp fp16|bf16]
        [--channels-last] [--compile] [--out result.json] [--plot result.png]

Two scopes: ``backbone`` (the backbone on a fixed random tensor of --batch x 3 x H x W) and
``test_step`` (data preprocessor, forward and post-processing of the whole detector or segmentor
on the output of the config's own test pipeline, batch 1 — the latency mmdet reports). Reports
median / min / max ms per image, images/s, parameters and GMACs (mmengine's analysis) before and
after folding, and the speed-up next to the GMACs ratio. ``--onnx`` also times the folded
backbone exported to ONNX and run by onnxruntime (CPU), in the same interleaved rounds.

Both models always run under the same settings: ``--amp`` (``torch.autocast`` in float16 or
bfloat16 for the backbone, neck and heads; post-processing stays float32, as mmcv's CPU NMS
needs; the folds themselves are computed in float64 and cast back), ``--channels-last``
(the models' 4-D weights and the backbone input in NHWC) and ``--compile`` (``torch.compile``
of both backbones; the first call, which compiles, is timed apart and reported as compile
time).

``--out`` and ``--plot`` may not be an input (the config, the checkpoint, a file the config
reads) or a link to one, checked before the timing; they are written atomically (an existing
file is replaced in one step).
"""

import argparse
import contextlib
import copy
import functools
import os.path as osp
import sys
import tempfile
import time
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model
from mmrepa.config.inputs import config_inputs
from mmrepa.errors import ConfigError
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.batches import add_shape_argument, default_input_shape, pipeline_batch
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.integrations.onnx import export_onnx, onnx_max_abs_error, onnxruntime_session, run_onnx
from mmrepa.integrations.optional import require
from mmrepa.utils import complexity, model_complexity, time_interleaved
from mmrepa.utils.files import atomic_output, write_json
from mmrepa.utils.latency import cpu_name
from mmrepa.utils.machine import finish, machine_info

TOOL = 'tools/benchmark.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', action=ConfigPath)
    parser.add_argument('--checkpoint', help='weights to load (random weights without)')
    add_shape_argument(parser)
    parser.add_argument('--batch', type=int, default=1, help='batch of the backbone scope')
    parser.add_argument('--repeat', type=int, default=10, help='timed rounds per scope')
    parser.add_argument('--warmup', type=int, default=2, help='untimed rounds first')
    parser.add_argument('--backbone-only', action='store_true', help='skip the test_step scope')
    parser.add_argument(
        '--onnx', action='store_true', help='also time the folded backbone in onnxruntime (CPU)'
    )
    parser.add_argument(
        '--amp',
        choices=sorted(AMP_DTYPES),
        help='time both models under torch.autocast in this precision',
    )
    parser.add_argument(
        '--channels-last',
        action='store_true',
        help='both models (4-D weights) and the backbone input in NHWC',
    )
    parser.add_argument(
        '--compile',
        action='store_true',
        help='torch.compile both backbones; compile time reported apart',
    )
    parser.add_argument(
        '--compile-backend', default='inductor', help="torch.compile's backend (default: inductor)"
    )
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument(
        '--keep-denormals',
        action='store_true',
        help='do not flush denormal floats to zero on the CPU (random weights '
        'produce them, and they slow every GEMM several times)',
    )
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--plot', help='draw a before/after bar chart here (PNG)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


AMP_DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}


def autocast_context(device: torch.device, amp: Optional[str]):
    """A factory of ``torch.autocast`` contexts in ``amp``'s dtype (of null contexts without
    ``amp``); a :class:`ConfigError` if this device cannot run that precision."""
    if amp is None:
        return contextlib.nullcontext
    dtype = AMP_DTYPES[amp]
    if not torch.amp.is_autocast_available(device.type):
        raise ConfigError(
            f'--amp {amp}: torch has no autocast for {device.type} devices; time without --amp'
        )
    if device.type == 'cuda' and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f'--amp bf16: {torch.cuda.get_device_name(device)} has no bfloat16 '
            'arithmetic; use --amp fp16'
        )
    try:  # the two ops every backbone runs
        with torch.autocast(device.type, dtype=dtype):
            F.conv2d(torch.ones(1, 1, 3, 3, device=device), torch.ones(1, 1, 3, 3, device=device))
            F.linear(torch.ones(2, 2, device=device), torch.ones(2, 2, device=device))
    except RuntimeError as err:
        raise ConfigError(
            f'--amp {amp}: {device} cannot run {dtype} autocast ({err}); time '
            'without --amp or on another device'
        ) from None
    return functools.partial(torch.autocast, device.type, dtype=dtype)


class Compiled(torch.nn.Module):
    """``torch.compile(module, backend=backend)``; its first call, which compiles, is timed
    into ``compile_seconds``."""

    def __init__(self, module: torch.nn.Module, backend: str):
        super().__init__()
        self.inner, self.compile_seconds = torch.compile(module, backend=backend), None

    def forward(self, *args, **kwargs):
        if self.compile_seconds is not None:
            return self.inner(*args, **kwargs)
        start = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.compile_seconds = time.perf_counter() - start
        return out


def _float32(out):
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, (list, tuple)):
        return type(out)(_float32(o) for o in out)
    if isinstance(out, dict):
        return {k: _float32(v) for k, v in out.items()}
    return out


@contextlib.contextmanager
def network_under_autocast(models, amp):
    """Inside, the forward of the backbone, the neck and every head of ``models`` runs under
    ``amp()`` and hands float32 on: post-processing (NMS, resizing) stays float32, as mmcv's
    CPU ops require."""
    parts = [
        m
        for model in models
        for name, m in model.named_modules()
        if name in ('backbone', 'neck') or name.split('.')[-1].endswith('head')
    ]
    for part in parts:

        def forward(*args, _forward=part.forward, **kwargs):
            with amp():
                return _float32(_forward(*args, **kwargs))

        part.forward = forward
    try:
        yield
    finally:
        for part in parts:
            del part.forward  # the class's forward again


def prepare(model, folded, args):
    """Apply --channels-last and --compile to both models alike; the compiled backbones."""
    for m in (model, folded):
        if args.channels_last:
            m.to(memory_format=torch.channels_last)
    if not args.compile:
        return {}
    for m in (model, folded):
        m.backbone = Compiled(m.backbone, args.compile_backend)
    return dict(before=model.backbone, after=folded.backbone)


def summarize(stats, images):
    out = {}
    for name, s in stats.items():
        per_image = [t / images for t in s.samples]
        out[name] = dict(
            median_ms=float(np.median(per_image)),
            min_ms=min(per_image),
            max_ms=max(per_image),
            images_per_s=1e3 / float(np.median(per_image)),
        )
    return out


def measure(name, variants, images, args, device):
    def progress(done, total):
        print(f'\r  {name}: {done}/{total} rounds', end='' if done < total else '\n', flush=True)

    # compiled models: the first call compiles, the next ones may specialise once more
    warmup = max(args.warmup, 3 if args.compile else 0)
    stats = time_interleaved(
        variants, repeat=args.repeat, warmup=warmup, device=device, progress=progress
    )
    return summarize(stats, images)


def onnx_variant(backbone, x, path):
    """Export ``backbone`` for ``x``'s shape; a call running it in onnxruntime, on as many
    threads as torch uses."""
    print('  exporting the folded backbone to ONNX', flush=True)
    export_onnx(backbone, x, path)
    session = onnxruntime_session(path, threads=torch.get_num_threads())
    err = onnx_max_abs_error(backbone, x, session)
    print(f'  onnxruntime vs PyTorch: max abs difference {err:.2e}', flush=True)
    return lambda: run_onnx(session, x)


def outputs(args) -> list:
    return [('--out', args.out), ('--plot', args.plot)]


def run(args):
    machine = machine_info()  # the load average as the measurement starts
    device = torch.device(args.device)
    if args.onnx and device.type != 'cpu':
        raise SystemExit('--onnx times onnxruntime on the CPU: add --device cpu')
    amp = autocast_context(device, args.amp)
    flush = device.type == 'cpu' and not args.keep_denormals and torch.set_flush_denormal(True)
    model = init_model(args.config, args.checkpoint, device, args.cfg_options)
    if model.cfg is not None:  # the files the config reads (RepOptVGG's scales), before timing
        check_outputs(TOOL, outputs(args), config_inputs(model.cfg))
    cfg = model.cfg
    shape = tuple(args.shape or default_input_shape(cfg))
    folded = mmrepa.reparameterize(copy.deepcopy(model))
    eager = dict(before=model.backbone, after=folded.backbone)  # for ONNX and MAC counts
    compiled_backbones = prepare(model, folded, args)
    result = dict(
        config=args.config,
        checkpoint=args.checkpoint,
        device=str(device),
        device_name=(torch.cuda.get_device_name(device) if device.type == 'cuda' else cpu_name()),
        threads=torch.get_num_threads(),
        flush_denormal=bool(flush),
        dtype=str(next(model.parameters()).dtype),
        amp=args.amp,
        channels_last=args.channels_last,
        compile=args.compile,
        shape=list(shape),
        batch=args.batch,
        repeat=args.repeat,
        warmup=args.warmup,
        torch=torch.__version__,
        machine=machine,
        scopes={},
    )

    result['scopes']['backbone'] = time_backbone(model, folded, eager, shape, amp, args, device)
    if compiled_backbones:
        result['compile_seconds'] = {k: m.compile_seconds for k, m in compiled_backbones.items()}
    if not args.backbone_only:
        result['scopes']['test_step'] = time_test_step(
            model, folded, eager, shape, amp, args, device
        )
    for scope in result['scopes'].values():
        scope['speedup'] = scope['before']['median_ms'] / scope['after']['median_ms']
        scope['latency_change_percent'] = 100.0 * (1 / scope['speedup'] - 1)
        scope['gmacs_ratio'] = scope['gmacs_before'] / scope['gmacs_after']
        scope['speedup_over_gmacs_ratio'] = scope['speedup'] / scope['gmacs_ratio']
    finish(machine)
    return result


def time_backbone(model, folded, eager: dict, shape, amp, args, device) -> dict:
    """The backbones before and after the fold (and in onnxruntime with --onnx) on a random
    batch, with their sizes."""
    x = torch.randn(args.batch, 3, *shape, device=device)
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    one = x[:1].contiguous()

    def under_amp(call):
        def run():
            with amp():
                return call()

        return run

    variants = dict(
        before=under_amp(lambda: model.backbone(x)), after=under_amp(lambda: folded.backbone(x))
    )
    with tempfile.TemporaryDirectory() as tmp:
        if args.onnx:
            variants['onnx'] = onnx_variant(
                eager['after'], x.contiguous(), osp.join(tmp, 'backbone.onnx')
            )
        scope = measure('backbone', variants, args.batch, args, device)
    before, after = complexity(eager['before'], (one,)), complexity(eager['after'], (one,))
    scope.update(
        params_before=before['params'],
        params_after=after['params'],
        gmacs_before=before['macs'] / 1e9,
        gmacs_after=after['macs'] / 1e9,
    )
    return scope


def time_test_step(model, folded, eager: dict, shape, amp, args, device) -> dict:
    """The whole networks' test step before and after the fold on one pipeline batch, with
    their sizes."""
    batch = pipeline_batch(model.cfg, shape)
    with network_under_autocast((model, folded), amp):
        scope = measure(
            'test_step',
            dict(before=lambda: model.test_step(batch), after=lambda: folded.test_step(batch)),
            1,
            args,
            device,
        )
    data = model.data_preprocessor(copy.deepcopy(batch), False)
    for m in (model, folded):  # mmengine's analysis traces the eager backbones
        m.backbone = eager['before' if m is model else 'after']
    before, after = model_complexity(model, data), model_complexity(folded, data)
    scope.update(
        params_before=before['params'],
        params_after=after['params'],
        gmacs_before=before['macs'] / 1e9,
        gmacs_after=after['macs'] / 1e9,
        input_shape=list(data['inputs'].shape),
    )
    return scope


def format_table(result):
    settings = ', '.join(
        s
        for s in (
            f'autocast {result["amp"]}' if result['amp'] else '',
            'channels-last' if result['channels_last'] else '',
            'compiled' if result['compile'] else '',
        )
        if s
    )
    kernels = result.get('machine', {}).get('torch_cpu_capability')
    kernels = f", torch's {kernels} kernels" if kernels and result['device'] == 'cpu' else ''
    lines = [
        f'{result["config"]}  |  {result["device"]} ({result["device_name"]}{kernels}), '
        f'{result["threads"]} threads, {result["dtype"]}'
        f'{" (" + settings + ")" if settings else ""}, input {result["shape"]}, '
        f'backbone batch {result["batch"]}',
        f'{"scope":<10}{"":<8}{"ms/img":>9}{"min":>9}{"max":>9}{"img/s":>8}'
        f'{"params M":>10}{"GMACs":>9}',
    ]
    for name, s in result['scopes'].items():
        for when in [w for w in ('before', 'after', 'onnx') if w in s]:
            t, folded = s[when], 'before' if when == 'before' else 'after'
            lines.append(
                f'{name:<10}{when:<8}{t["median_ms"]:>9.1f}{t["min_ms"]:>9.1f}'
                f'{t["max_ms"]:>9.1f}{t["images_per_s"]:>8.2f}'
                f'{s["params_" + folded] / 1e6:>10.2f}{s["gmacs_" + folded]:>9.1f}'
            )
        lines.append(
            f'{name:<10}speed-up {s["speedup"]:.3f}x (latency '
            f'{s["latency_change_percent"]:+.1f} %), GMACs ratio {s["gmacs_ratio"]:.3f}, '
            f'speed-up / GMACs ratio {s["speedup_over_gmacs_ratio"]:.3f}'
        )
    if 'compile_seconds' in result:
        lines.append(
            'compile time (first call, not in the timings): '
            + ', '.join(f'{k} {v:.1f} s' for k, v in result['compile_seconds'].items())
        )
    return '\n'.join(lines)


def plot(result, path):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = list(result['scopes'])
    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(names), 3.5))
    xs = np.arange(len(names))
    whens = [w for w in ('before', 'after', 'onnx') if w in result['scopes'][names[0]]]
    width = 0.8 / len(whens)
    for i, when in enumerate(whens):
        at = [j for j, n in enumerate(names) if when in result['scopes'][n]]
        values = [result['scopes'][names[j]][when]['median_ms'] for j in at]
        label = 'folded, onnxruntime' if when == 'onnx' else f'{when} folding'
        bars = ax.bar(xs[at] + (i - (len(whens) - 1) / 2) * width, values, width=width, label=label)
        ax.bar_label(bars, fmt='%.0f')
    ax.set_xticks(xs, names)
    ax.set_ylabel('ms / image (median)')
    ax.set_title(
        f'{osp.basename(result["config"])}\n{result["shape"][0]}x{result["shape"][1]}, '
        f'{result["device"]}',
        fontsize=9,
    )
    ax.legend()
    fig.tight_layout()
    with atomic_output(path) as tmp:  # .tmp.png: the format from the extension, as for path
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


@one_line_errors(TOOL)
def main(argv=None):
    args = parse_args(argv)
    check_outputs(TOOL, outputs(args), [('config', args.config), ('checkpoint', args.checkpoint)])
    require(
        *(('onnx', 'onnxruntime') if args.onnx else ()),
        *(('matplotlib',) if args.plot else ()),
        tool=TOOL,
    )
    with torch.no_grad():
        result = run(args)
    print(format_table(result))
    if args.out:
        write_json(result, args.out)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == '__main__':
    sys.exit(0 if main() else 1)
