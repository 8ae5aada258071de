"""Measure what folding buys: the unfolded and the folded model, interleaved, in one run.

    python tools/benchmark.py CONFIG [--checkpoint CKPT] [--shape H W] [--batch N]
        [--repeat R] [--warmup W] [--backbone-only] [--onnx] [--out result.json]
        [--plot result.png]

Two scopes: ``backbone`` (the backbone on a fixed random tensor of --batch x 3 x H x W) and
``test_step`` (data preprocessor, forward and post-processing of the whole detector or segmentor
on the output of the config's own test pipeline, batch 1 — the latency mmdet reports). Reports
median / min / max ms per image, images/s, parameters and GMACs (mmengine's analysis) before and
after folding, and the speed-up next to the GMACs ratio. ``--onnx`` also times the folded
backbone exported to ONNX and run by onnxruntime (CPU), in the same interleaved rounds.
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
import tempfile

import numpy as np
import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import default_input_shape, init_model, one_line_errors, pipeline_batch
from mmrepa.utils import complexity, model_complexity, time_interleaved
from mmrepa.utils.latency import cpu_name
from mmrepa.utils.onnx import export_onnx, onnx_max_abs_error, onnxruntime_session, run_onnx


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('--checkpoint', help='weights to load (random weights without)')
    parser.add_argument('--shape', nargs=2, type=int, metavar=('H', 'W'), default=None,
                        help='input size (default: 800 1333 for detection, 512 512 for '
                        'segmentation, 224 224 for classification)')
    parser.add_argument('--batch', type=int, default=1, help='batch of the backbone scope')
    parser.add_argument('--repeat', type=int, default=10, help='timed rounds per scope')
    parser.add_argument('--warmup', type=int, default=2, help='untimed rounds first')
    parser.add_argument('--backbone-only', action='store_true', help='skip the test_step scope')
    parser.add_argument('--onnx', action='store_true',
                        help='also time the folded backbone in onnxruntime (CPU)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--keep-denormals', action='store_true',
                        help='do not flush denormal floats to zero on the CPU (random weights '
                        'produce them, and they slow every GEMM several times)')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--plot', help='draw a before/after bar chart here (PNG)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def summarize(stats, images):
    out = {}
    for name, s in stats.items():
        per_image = [t / images for t in s.samples]
        out[name] = dict(median_ms=float(np.median(per_image)), min_ms=min(per_image),
                         max_ms=max(per_image),
                         images_per_s=1e3 / float(np.median(per_image)))
    return out


def measure(name, variants, images, args, device):
    def progress(done, total):
        print(f'\r  {name}: {done}/{total} rounds', end='' if done < total else '\n',
              flush=True)

    stats = time_interleaved(variants, repeat=args.repeat, warmup=args.warmup, device=device,
                             progress=progress)
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


def run(args):
    device = torch.device(args.device)
    if args.onnx and device.type != 'cpu':
        raise SystemExit('--onnx times onnxruntime on the CPU: add --device cpu')
    flush = device.type == 'cpu' and not args.keep_denormals and torch.set_flush_denormal(True)
    model = init_model(args.config, args.checkpoint, device, args.cfg_options)
    cfg = model.cfg
    shape = tuple(args.shape or default_input_shape(cfg))
    folded = mmrepa.reparameterize(copy.deepcopy(model))
    result = dict(config=args.config, checkpoint=args.checkpoint, device=str(device),
                  device_name=(torch.cuda.get_device_name(device) if device.type == 'cuda'
                               else cpu_name()),
                  threads=torch.get_num_threads(), flush_denormal=bool(flush),
                  dtype=str(next(model.parameters()).dtype),
                  shape=list(shape), batch=args.batch, repeat=args.repeat, warmup=args.warmup,
                  torch=torch.__version__, scopes={})

    x = torch.randn(args.batch, 3, *shape, device=device)
    one = x[:1]
    variants = dict(before=lambda: model.backbone(x), after=lambda: folded.backbone(x))
    with tempfile.TemporaryDirectory() as tmp:
        if args.onnx:
            variants['onnx'] = onnx_variant(folded.backbone, x, osp.join(tmp, 'backbone.onnx'))
        scope = measure('backbone', variants, args.batch, args, device)
    before, after = complexity(model.backbone, (one, )), complexity(folded.backbone, (one, ))
    scope.update(params_before=before['params'], params_after=after['params'],
                 gmacs_before=before['macs'] / 1e9, gmacs_after=after['macs'] / 1e9)
    result['scopes']['backbone'] = scope

    if not args.backbone_only:
        batch = pipeline_batch(cfg, shape)
        scope = measure('test_step', dict(before=lambda: model.test_step(batch),
                                          after=lambda: folded.test_step(batch)), 1, args, device)
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        before, after = model_complexity(model, data), model_complexity(folded, data)
        scope.update(params_before=before['params'], params_after=after['params'],
                     gmacs_before=before['macs'] / 1e9, gmacs_after=after['macs'] / 1e9,
                     input_shape=list(data['inputs'].shape))
        result['scopes']['test_step'] = scope

    for scope in result['scopes'].values():
        scope['speedup'] = scope['before']['median_ms'] / scope['after']['median_ms']
        scope['latency_change_percent'] = 100.0 * (1 / scope['speedup'] - 1)
        scope['gmacs_ratio'] = scope['gmacs_before'] / scope['gmacs_after']
        scope['speedup_over_gmacs_ratio'] = scope['speedup'] / scope['gmacs_ratio']
    return result


def format_table(result):
    lines = [f"{result['config']}  |  {result['device']} ({result['device_name']}), "
             f"{result['threads']} threads, {result['dtype']}, input {result['shape']}, "
             f"backbone batch {result['batch']}",
             f"{'scope':<10}{'':<8}{'ms/img':>9}{'min':>9}{'max':>9}{'img/s':>8}"
             f"{'params M':>10}{'GMACs':>9}"]
    for name, s in result['scopes'].items():
        for when in [w for w in ('before', 'after', 'onnx') if w in s]:
            t, folded = s[when], 'before' if when == 'before' else 'after'
            lines.append(f"{name:<10}{when:<8}{t['median_ms']:>9.1f}{t['min_ms']:>9.1f}"
                         f"{t['max_ms']:>9.1f}{t['images_per_s']:>8.2f}"
                         f"{s['params_' + folded] / 1e6:>10.2f}{s['gmacs_' + folded]:>9.1f}")
        lines.append(f"{name:<10}speed-up {s['speedup']:.3f}x (latency "
                     f"{s['latency_change_percent']:+.1f} %), GMACs ratio {s['gmacs_ratio']:.3f}, "
                     f"speed-up / GMACs ratio {s['speedup_over_gmacs_ratio']:.3f}")
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
        bars = ax.bar(xs[at] + (i - (len(whens) - 1) / 2) * width, values, width=width,
                      label=label)
        ax.bar_label(bars, fmt='%.0f')
    ax.set_xticks(xs, names)
    ax.set_ylabel('ms / image (median)')
    ax.set_title(f"{osp.basename(result['config'])}\n{result['shape'][0]}x{result['shape'][1]}, "
                 f"{result['device']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@one_line_errors('tools/benchmark.py')
def main(argv=None):
    args = parse_args(argv)
    with torch.no_grad():
        result = run(args)
    print(format_table(result))
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == '__main__':
    sys.exit(0 if main() else 1)
