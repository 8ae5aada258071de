"""INT8 (onnxruntime QDQ; OpenVINO with NNCF) of the trained demo models: SQNR, metric and
latency, per fold form.

    OMP_NUM_THREADS=1 python benchmarks/quantize_demo_models.py \
        [--out benchmarks/results/quantize_demo_models.json] [--only NAME [NAME ...]] \
        [--settings LABEL [LABEL ...]] [--demo-root DIR]

Runs ``tools/quantize.py`` (one process per measurement, one thread) on the trained demo
models (benchmarks/demo_models.py), each as trained (``unfolded``), folded (``folded``:
mmrepa.reparameterize) and folded with the identity shortcuts kept out of the weights
(``identity-apart``, the INT8-aware fold), plus a few settings the issue asks about (calibration
method, reduce_range, per-tensor weights, float Softmax, a larger input), and the main ones again
in OpenVINO with NNCF (settings ``openvino``: RepOpt-VGG against RepVGG at INT8 there too).

Last, onnxruntime's profiler splits the folded RePa-Swin backbone's float32 and INT8 run times by
kind of op, which bounds the speed-up INT8 kernels can give (Amdahl). Missing checkpoints are
skipped (and listed). Prints a table; writes every result as JSON, with the machine
(mmrepa.utils.machine: CPU, vector extensions, threads, load at start and end) of the whole run
under ``machine`` and of each run under the run's ``machine`` (as tools/quantize.py recorded it;
``--only`` and ``--settings`` keep the runs in --out they do not select).
"""

import argparse
import collections
import json
import os
import os.path as osp
import sys
import tempfile

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from demo_models import (  # noqa: E402
    MODELS,
    ROOT,
    add_demo_root_argument,
    run_tool,
    stamp,
    threads_from_env,
    use_demo_root,
)

LARGE = ['test_dataloader.dataset.pipeline.1.scale=(512,512)']  # the detector's test Resize
# (model, part, form, settings label, extra arguments)
RUNS = [
    ('retinanet', 'full', 'identity-apart', 'default', ['--report']),
    ('retinanet', 'full', 'folded', 'default', []),
    ('retinanet', 'full', 'unfolded', 'default', []),
    ('retinanet', 'full', 'folded', 'percentile', ['--method', 'percentile']),
    ('retinanet', 'full', 'folded', 'reduce_range off', ['--reduce-range', 'off']),
    ('retinanet', 'full', 'folded', 'float Softmax', ['--exclude-ops', 'Softmax']),
    ('retinanet', 'full', 'folded', 'S8S8', ['--activation-type', 'int8']),
    ('retinanet', 'backbone', 'identity-apart', 'default', ['--report']),
    ('retinanet', 'backbone', 'folded', 'default', []),
    (
        'retinanet',
        'backbone',
        'folded',
        'MatMul/Gemm/Conv only',
        [
            '--exclude-ops',
            'Add',
            'Mul',
            'Softmax',
            'Transpose',
            'Reshape',
            'Split',
            'Squeeze',
            'Unsqueeze',
            'Gather',
            'Slice',
            'Concat',
        ],
    ),
    (
        'retinanet',
        'backbone',
        'folded',
        '512 x 512 input',
        ['--no-metric', '--cfg-options', *LARGE],
    ),
    ('classifier', 'backbone', 'identity-apart', 'default', ['--report']),
    ('classifier', 'backbone', 'folded', 'default', []),
    ('classifier', 'backbone', 'unfolded', 'default', []),
    ('mask-rcnn', 'backbone', 'folded', 'default', ['--report']),
    ('mask-rcnn', 'backbone', 'unfolded', 'default', []),
    ('repopt', 'backbone', 'folded', 'default', ['--report']),
    ('repopt', 'backbone', 'unfolded', 'default', []),
    ('repopt', 'backbone', 'folded', 'per-tensor', ['--per-tensor']),
    ('repvgg', 'backbone', 'identity-apart', 'default', ['--report']),
    ('repvgg', 'backbone', 'folded', 'default', []),
    ('repvgg', 'backbone', 'unfolded', 'default', []),
    ('repvgg', 'backbone', 'folded', 'per-tensor', ['--per-tensor']),
    ('repvgg', 'backbone', 'identity-apart', 'per-tensor', ['--per-tensor']),
    # OpenVINO with NNCF (tools/quantize.py --backend openvino): the same comparisons
    *(
        (model, part, form, 'openvino', ['--backend', 'openvino'])
        for model, part, form in (
            ('retinanet', 'full', 'folded'),
            ('retinanet', 'backbone', 'folded'),
            ('retinanet', 'backbone', 'unfolded'),
            ('mask-rcnn', 'backbone', 'folded'),
            ('upernet', 'backbone', 'folded'),
            ('repopt', 'backbone', 'folded'),
            ('repopt', 'backbone', 'unfolded'),
            ('repvgg', 'backbone', 'folded'),
            ('repvgg', 'backbone', 'identity-apart'),
            ('repvgg', 'backbone', 'unfolded'),
        )
    ),
]
KINDS = {
    'MatMul / Gemm / Conv': {
        'Conv',
        'MatMul',
        'Gemm',
        'FusedMatMul',
        'FusedConv',
        'QLinearConv',
        'QLinearMatMul',
        'QGemm',
        'MatMulIntegerToFloat',
        'NchwcConv',
    },
    'Quantize / Dequantize': {'QuantizeLinear', 'DequantizeLinear'},
    'data movement': {
        'Transpose',
        'Reshape',
        'Split',
        'Squeeze',
        'Unsqueeze',
        'Gather',
        'Slice',
        'Concat',
        'Expand',
        'ReorderInput',
        'ReorderOutput',
    },
}


def run(model, part, form, extra, tmp):
    config, ckpt = MODELS[model].paths()
    ext = '.xml' if '--backend' in extra and 'openvino' in extra else '.onnx'
    out, dump = osp.join(tmp, f'model_int8{ext}'), osp.join(tmp, 'result.json')
    args = [
        config,
        ckpt,
        '--form',
        form,
        '--repeat',
        '200',
        '--out',
        out,
        '--force',
        '--dump',
        dump,
        *(['--full'] if part == 'full' else []),
        *extra,
    ]
    return run_tool('quantize.py', args, dump), out


def summary(result) -> dict:
    """The result without the per-layer lists (kept: the modules folding changed)."""
    keep = {k: v for k, v in result.items() if k not in ('layers', 'fold_ranges')}
    if 'fold_ranges' in result:
        keep['fold_ranges'] = [r for r in result['fold_ranges'] if r['changed']]
    return keep


def profile(path, runs=100):
    """Mean ms per run by kind of op (onnxruntime's profiler, one thread)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = osp.join(tmp, 'profile')
        session = ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
        x = (
            np.random.default_rng(0)
            .standard_normal(session.get_inputs()[0].shape)
            .astype(np.float32)
        )
        for _ in range(runs):
            session.run(None, {'input': x})
        with open(session.end_profiling()) as f:
            events = json.load(f)
    by_op, total = collections.Counter(), 0.0
    for e in events:
        if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time'):
            by_op[e['args']['op_name']] += e['dur'] / 1e3 / runs
        elif e.get('cat') == 'Session' and e['name'] == 'model_run':
            total += e['dur'] / 1e3 / runs
    kinds = collections.Counter()
    for op, ms in by_op.items():
        kinds[next((k for k, ops in KINDS.items() if op in ops), 'other float / QLinear ops')] += ms
    return dict(
        total_ms=total,
        by_kind_ms=dict(kinds),
        by_op_ms=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
    )


def profile_repa_swin(int8_path, tmp):
    """Float32 and INT8 profiles of the folded RePa-Swin backbone at the demo's input."""
    import torch

    import mmrepa
    from mmrepa.apis import init_model
    from mmrepa.integrations.onnx import export_onnx
    from mmrepa.integrations.quantize import input_shape, runtime_op_counts

    model = mmrepa.reparameterize(init_model(*MODELS['retinanet'].paths()))
    float_path = osp.join(tmp, 'float32.onnx')
    with torch.no_grad():
        export_onnx(model.backbone, torch.zeros(input_shape(int8_path)), float_path)
    result = {}
    for name, path in (('float32', float_path), ('int8', int8_path)):
        result[name] = dict(profile(path), runtime_ops=runtime_op_counts(path))
    f32, int8 = result['float32']['by_kind_ms'], result['int8']['by_kind_ms']
    share = f32.get('MatMul / Gemm / Conv', 0) / sum(f32.values())
    result['float32_matmul_share'] = share
    # how much faster the INT8 MatMul / Gemm / Conv kernels (QLinearMatMul, QGemm, ...) ran
    result['int8_matmul_kernel_speedup'] = f32.get('MatMul / Gemm / Conv', 0) / int8.get(
        'MatMul / Gemm / Conv', float('nan')
    )
    result['speedup_bound_if_matmuls_were_free'] = 1 / (1 - share)
    result['speedup_bound_if_matmuls_were_2x'] = 1 / (1 - share / 2)
    return result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        '--out', default=osp.join(ROOT, 'benchmarks', 'results', 'quantize_demo_models.json')
    )
    parser.add_argument(
        '--only',
        nargs='+',
        choices=sorted({m for m, *_ in RUNS}),
        help="measure these models again; the others' results in --out stay",
    )
    parser.add_argument(
        '--settings',
        nargs='+',
        choices=sorted({r[3] for r in RUNS}),
        help="measure only the runs with these settings (e.g. openvino); the others' results "
        'in --out stay',
    )
    add_demo_root_argument(parser)
    return parser.parse_args(argv)


def measure(results: dict, selected) -> list:
    """Every selected run (into ``results``, with the backbone's profile); returns its rows."""
    rows = []
    with tempfile.TemporaryDirectory(prefix='mmrepa.qbench.') as tmp:
        for model, part, form, label, extra in RUNS:
            if not selected(model, label):
                continue
            what, backbone = MODELS[model].what, MODELS[model].backbone
            if MODELS[model].missing():
                results['skipped'].append(f'{model}: no {", ".join(MODELS[model].missing())}')
                continue
            print(f'{backbone} {what} {part} {form} ({label}) ...', flush=True)
            result, int8_path = run(model, part, form, extra, tmp)
            results['runs'].append(
                dict(
                    summary(result),
                    model=model,
                    backbone=backbone,
                    what=what,
                    settings=label,
                    **stamp(),
                )
            )
            rows.append(results['runs'][-1])
            if (model, part, form, label) == ('retinanet', 'backbone', 'folded', 'default'):
                results['profile_repa_swin_backbone'] = profile_repa_swin(int8_path, tmp)
    return rows


def print_results(results: dict, rows: list) -> None:
    """This run's rows as a markdown table, and the backbone's profile."""
    print(
        '\n| backbone | model | part | form | settings | SQNR dB | metric f32 -> INT8 | '
        'f32 / INT8 ms | speed-up |\n|---|---|---|---|---|---|---|---|---|'
    )
    for r in rows:
        metric = ''
        if 'metric' in r:
            key = r['metric_key']
            metric = f'{r["metric"]["float32"][key]:.4g} -> {r["metric"]["int8"][key]:.4g}'
        lat = r.get('latency_ms', {})
        ms = f'{lat["float32"]["median"]:.2f} / {lat["int8"]["median"]:.2f}' if lat else ''
        print(
            f'| {r["backbone"]} | {r["what"]} | {r["part"]} | {r["form"]} | {r["settings"]} | '
            f'{r["sqnr_db"]:.1f} | {metric} | {ms} | {r.get("speedup", float("nan")):.2f} |'
        )
    if 'profile_repa_swin_backbone' in results:
        p = results['profile_repa_swin_backbone']
        for name in ('float32', 'int8'):
            kinds = ', '.join(f'{k} {v:.2f}' for k, v in p[name]['by_kind_ms'].items())
            print(f'profile {name}: {p[name]["total_ms"]:.2f} ms per run ({kinds})')
        print(
            f'float32 MatMul/Gemm/Conv share {p["float32_matmul_share"]:.0%}: INT8 speed-up '
            f'bound {p["speedup_bound_if_matmuls_were_2x"]:.2f}x at 2x faster kernels, '
            f'{p["speedup_bound_if_matmuls_were_free"]:.2f}x if they were free; the INT8 '
            f'kernels ran {p["int8_matmul_kernel_speedup"]:.2f}x faster'
        )
        print('INT8 ops onnxruntime runs:', p['int8']['runtime_ops'])
    for s in results['skipped']:
        print('skipped:', s)


def main(argv=None):
    args = parse_args(argv)
    use_demo_root(args.demo_root)
    import onnxruntime

    from mmrepa.integrations.quantize import needs_reduce_range
    from mmrepa.utils.files import write_json
    from mmrepa.utils.latency import cpu_name
    from mmrepa.utils.machine import finish, machine_info

    threads_from_env()  # the tools' threads (and the profile's one) recorded as they ran
    machine = machine_info()
    results = dict(
        cpu=cpu_name(),
        onnxruntime=onnxruntime.__version__,
        omp_num_threads=os.environ['OMP_NUM_THREADS'],
        reduce_range_auto=needs_reduce_range(),
        machine=machine,
        runs=[],
        skipped=[],
    )

    def selected(model, label):
        return (not args.only or model in args.only) and (
            not args.settings or label in args.settings
        )

    profiled = selected('retinanet', 'default')
    if (args.only or args.settings) and osp.exists(args.out):
        with open(args.out) as f:
            kept = json.load(f)
        results['runs'] = [r for r in kept['runs'] if not selected(r['model'], r['settings'])]
        if not profiled and 'profile_repa_swin_backbone' in kept:
            results['profile_repa_swin_backbone'] = kept['profile_repa_swin_backbone']
    rows = measure(results, selected)
    finish(machine)
    write_json(results, args.out)
    print_results(results, rows)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
