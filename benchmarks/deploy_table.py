"""Deployment speed and accuracy per backbone family: the README's "Deployed" table.

    OMP_NUM_THREADS=1 python benchmarks/deploy_table.py \
        [--out benchmarks/results/deploy_table.json] [--only NAME [NAME ...]] [--repeat R]

``--only`` measures those again and keeps the other rows of ``--out``.

For each trained demo model (benchmarks/demo_models.py: one per backbone family) the backbone, at
the input its config's test pipeline gives, is measured as trained (unfolded) and folded:

- eager float32 in PyTorch, unfolded and folded interleaved (``tools/benchmark.py``);
- compiled float32: the same with ``--compile`` (inductor), compile time kept apart;
- onnxruntime float32 and INT8 (QDQ, per-channel weights, calibrated on 64 training images),
  interleaved per form (``tools/quantize.py --form unfolded|folded|identity-apart``; the last
  is the INT8-aware fold that keeps identity shortcuts out of the weights), with the SQNR of
  the INT8 outputs and the test metric with the backbone in float32 and in INT8.

Last (``full-width``), the demo RetinaNet built at RePa-Swin-T's widths with random weights:
onnxruntime float32 and INT8 of its folded backbone at 224², which shows what width does to
the INT8 speed-up (the demo backbones are 32-256 channels wide).

Every tool runs in its own process on one thread (OMP_NUM_THREADS), so the rows compare; run it
on an otherwise idle machine (about an hour on this 2-core CPU, most of it inductor compiling).
A family whose checkpoint is missing is skipped and listed. Prints the table; writes every
result as JSON.
"""
import argparse
import json
import os
import os.path as osp
import sys
import tempfile

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from demo_models import MODELS, ROOT, run_tool, stamp  # noqa: E402

FORMS = ('unfolded', 'folded', 'identity-apart')
# The demo backbones are 32-256 channels wide, where INT8 kernels barely beat float32: the demo
# RetinaNet at RePa-Swin-T's widths (96-768), random weights, 224² in, shows the width's effect.
FULL_WIDTH = {'model.backbone.arch': 'tiny', 'model.neck.in_channels': [192, 384, 768],
              'test_dataloader.dataset.pipeline.1.scale': (224, 224)}
FULL_WIDTH_CONFIG = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def quantize(config: str, ckpt: str, form: str, repeat: int, tmp: str, *extra) -> dict:
    print(f'  onnxruntime float32 / INT8, {form}', flush=True)
    dump = osp.join(tmp, 'result.json')
    return run_tool('quantize.py', [config, ckpt, '--form', form, '--repeat', str(repeat),
                                    '--out', osp.join(tmp, 'int8.onnx'), '--force',
                                    '--dump', dump, *extra], dump)


def onnx_row(r: dict) -> dict:
    return dict(float32_ms=r['latency_ms']['float32']['median'],
                int8_ms=r['latency_ms']['int8']['median'], speedup=r['speedup'],
                sqnr_db=r['sqnr_db'])


def measure_full_width(repeat: int, tmp: str) -> dict:
    """onnxruntime float32 / INT8 of the folded backbone of FULL_WIDTH_CONFIG at FULL_WIDTH
    (random weights and BatchNorm statistics: latency and SQNR, no metric)."""
    import torch

    from mmrepa.apis import init_model, load_config
    model = init_model(load_config(FULL_WIDTH_CONFIG, FULL_WIDTH))
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_(0, 0.1, generator=g)
            m.running_var.uniform_(0.5, 2, generator=g)
    ckpt = osp.join(tmp, 'full_width.pth')
    torch.save(dict(state_dict=model.state_dict()), ckpt)
    options = ['--no-metric', '--cfg-options',
               *(f'{k}={v}'.replace(' ', '') for k, v in FULL_WIDTH.items())]
    out = dict(config=osp.relpath(FULL_WIDTH_CONFIG, ROOT), cfg_options=FULL_WIDTH, onnx={})
    for form in ('folded', 'identity-apart'):
        r = quantize(FULL_WIDTH_CONFIG, ckpt, form, repeat, tmp, *options)
        out['onnx'][form] = onnx_row(r)
        out['input_shape'] = r['input_shape']
    return out


def measure(name: str, repeat: int, tmp: str) -> dict:
    """All measurements of one demo model; the input shape comes from tools/quantize.py."""
    config, ckpt = MODELS[name].paths()
    out = dict(what=MODELS[name].what, backbone=MODELS[name].backbone,
               config=osp.relpath(config, ROOT), checkpoint=osp.relpath(ckpt, ROOT), onnx={})
    for form in FORMS:
        r = quantize(config, ckpt, form, repeat, tmp)
        out['onnx'][form] = onnx_row(r)
        metric = r['metric']
        out['onnx'][form].update(
            metric_float32=metric['float32'][r['metric_key']],
            metric_int8=metric['int8'][r['metric_key']], metric_drop=r['metric_drop'])
        out.update(input_shape=r['input_shape'], metric_key=r['metric_key'])
    shape = [str(s) for s in out['input_shape'][2:]]
    for mode, flags in (('eager', []), ('compiled', ['--compile'])):
        print(f'  PyTorch float32, {mode}', flush=True)
        r = run_tool('benchmark.py', [config, '--checkpoint', ckpt, '--backbone-only',
                                      '--shape', *shape, '--repeat', str(repeat), '--warmup',
                                      '10', '--out', osp.join(tmp, 'result.json'), *flags],
                     osp.join(tmp, 'result.json'))
        scope = r['scopes']['backbone']
        out[mode] = dict(unfolded_ms=scope['before']['median_ms'],
                         folded_ms=scope['after']['median_ms'], speedup=scope['speedup'])
        if mode == 'eager':
            out.update(gmacs_unfolded=scope['gmacs_before'], gmacs_folded=scope['gmacs_after'])
        else:
            out[mode]['compile_seconds'] = dict(unfolded=r['compile_seconds']['before'],
                                                folded=r['compile_seconds']['after'])
    return out


def fmt(value, spec='.2f'):
    return '–' if value is None else format(value, spec)


def table(results: dict) -> str:
    lines = ['| family (demo model, input) | form | eager fp32 ms | compiled fp32 ms | '
             'ORT fp32 ms | ORT INT8 ms | INT8 speed-up | INT8 SQNR dB | metric fp32 → INT8 |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in results['models'].values():
        h, w = r['input_shape'][2:]
        name = f"{r['backbone']} ({r['what']}, {h}×{w})"
        for form in FORMS:
            o = r['onnx'][form]
            key = 'folded' if form == 'folded' else 'unfolded'
            torch_ms = [None if form == 'identity-apart' else r[m][f'{key}_ms']
                        for m in ('eager', 'compiled')]
            lines.append(
                f"| {name if form == 'unfolded' else ''} | {form} | {fmt(torch_ms[0])} | "
                f"{fmt(torch_ms[1])} | {o['float32_ms']:.2f} | {o['int8_ms']:.2f} | "
                f"{o['speedup']:.2f}× | {o['sqnr_db']:.1f} | {o['metric_float32']:.3f} → "
                f"{o['metric_int8']:.3f} |")
    if 'full_width' in results:
        r = results['full_width']
        h, w = r['input_shape'][2:]
        label = f'RePa-Swin-T widths, RetinaNet demo, random weights ({h}×{w})'
        for form, o in r['onnx'].items():
            lines.append(
                f"| {label if form == 'folded' else ''} | {form} | – | – | "
                f"{o['float32_ms']:.2f} | {o['int8_ms']:.2f} | "
                f"{o['speedup']:.2f}× | {o['sqnr_db']:.1f} | – |")
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--out', default=osp.join(ROOT, 'benchmarks', 'results',
                                                  'deploy_table.json'))
    parser.add_argument('--only', nargs='+', choices=[*MODELS, 'full-width'],
                        help="measure these models again; the others' results in --out stay")
    parser.add_argument('--repeat', type=int, default=200, help='timed rounds per measurement')
    args = parser.parse_args(argv)
    import onnxruntime
    import torch

    from mmrepa.utils.latency import cpu_name
    results = dict(cpu=cpu_name(), torch=torch.__version__, onnxruntime=onnxruntime.__version__,
                   omp_num_threads=os.environ.get('OMP_NUM_THREADS', '1'), repeat=args.repeat,
                   command=' '.join([osp.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
                   models={}, skipped=[])
    if args.only and osp.exists(args.out):
        with open(args.out) as f:
            kept = json.load(f)
        results['models'] = {k: v for k, v in kept['models'].items() if k not in args.only}
        if 'full-width' not in args.only and 'full_width' in kept:
            results['full_width'] = kept['full_width']
    with tempfile.TemporaryDirectory(prefix='mmrepa.deploy_table.') as tmp:
        for name, model in MODELS.items():
            if args.only and name not in args.only:
                continue
            if model.missing():
                results['skipped'].append(f"{name}: no {', '.join(model.missing())}")
                continue
            print(f'{model.backbone} {model.what}', flush=True)
            results['models'][name] = dict(measure(name, args.repeat, tmp), **stamp())
        if not args.only or 'full-width' in args.only:
            print('RePa-Swin-T widths, random weights', flush=True)
            results['full_width'] = dict(measure_full_width(args.repeat, tmp), **stamp())
    results['models'] = {k: results['models'][k] for k in MODELS if k in results['models']}
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out + '.tmp', 'w') as f:
        json.dump(results, f, indent=2)
    os.replace(args.out + '.tmp', args.out)
    print(table(results))
    for s in results['skipped']:
        print('skipped:', s)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
