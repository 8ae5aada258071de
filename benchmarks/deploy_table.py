"""Deployment speed and accuracy per backbone family: the README's deployment table.

    OMP_NUM_THREADS=1 python benchmarks/deploy_table.py \
        [--out benchmarks/results/deploy_table.json] [--only NAME [NAME ...]] [--repeat R] \
        [--demo-root DIR]

``--only`` measures those again and keeps the other rows of ``--out``.

For each trained demo model (benchmarks/demo_models.py: one per backbone family) the backbone
is measured as trained (``unfolded``), folded (``folded``: mmrepa.reparameterize) and folded
for INT8 (``identity-apart``: identity shortcuts kept out of the weights), on the first test
image through the config's test pipeline:

- INT8 with ``tools/quantize.py`` (onnxruntime, QDQ, per-channel weights, calibrated on 64
  training images): SQNR of the INT8 outputs against float32 and the test metric with the
  backbone in float32 and in INT8 (the rest of the model in PyTorch);
- the same with ``tools/quantize.py --backend openvino`` (OpenVINO, NNCF post-training INT8);
- then, in one process and one interleaved timing (A B C ... A B C ..., so machine drift hits
  every variant alike): eager and compiled (``torch.compile``, inductor; compile time kept
  apart) PyTorch float32 of the unfolded and folded backbone, and onnxruntime and OpenVINO
  float32 and INT8 of every form. Per model: ``fold_speedup`` (unfolded / folded time in each
  runtime) and ``end_to_end`` (unfolded eager float32 / folded OpenVINO INT8).

Last (``full-width``), the demo RetinaNet built at RePa-Swin-T's widths (96-768 channels) with
random weights and BatchNorm statistics, at 224²: the same without the metric, which shows what
width does to the INT8 speed-up (the demo backbones are 32-256 channels wide).

One thread (OMP_NUM_THREADS, default 1) for PyTorch and onnxruntime alike; run it on an
otherwise idle machine. A family whose checkpoint is missing is skipped and listed. Prints the
table; writes every result as JSON, with the machine (mmrepa.utils.machine: CPU, vector
extensions, threads, load at start and end) of the whole run under ``machine`` and of each row
under the row's ``machine`` (``--only`` keeps rows measured by other runs).
"""

import argparse
import copy
import functools
import json
import os
import os.path as osp
import sys
import tempfile
import time
from typing import List, Optional

import torch

from mmrepa import reparameterize
from mmrepa.integrations.onnx import export_onnx, onnxruntime_session
from mmrepa.integrations.openvino import OpenVINOSession
from mmrepa.integrations.quantize import fold_identity_apart, pipeline_inputs
from mmrepa.utils.files import write_json
from mmrepa.utils.latency import cpu_name, time_interleaved
from mmrepa.utils.machine import finish, machine_info

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

FORMS = ('unfolded', 'folded', 'identity-apart')
TORCH_FORMS = ('unfolded', 'folded')  # identity-apart is an INT8 form
# The demo backbones are 32-256 channels wide, where INT8 kernels barely beat float32: the demo
# RetinaNet at RePa-Swin-T's widths (96-768), random weights, 224² in, shows the width's effect.
FULL_WIDTH = {
    'model.backbone.arch': 'tiny',
    'model.neck.in_channels': [192, 384, 768],
    'test_dataloader.dataset.pipeline.1.scale': (224, 224),
}
FULL_WIDTH_CONFIG = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def quantized(
    config: str, ckpt: str, form: str, tmp: str, options: List[str], backend: str = 'onnxruntime'
) -> dict:
    """tools/quantize.py on one form in ``backend``, untimed: its results; the INT8 file in
    ``tmp`` (``{form}_int8.onnx``, or ``.xml`` for OpenVINO)."""
    print(f'  INT8 {form} ({backend}): calibration, SQNR, metric', flush=True)
    dump = osp.join(tmp, 'result.json')
    ext = '.xml' if backend == 'openvino' else '.onnx'
    return run_tool(
        'quantize.py',
        [
            config,
            ckpt,
            '--backend',
            backend,
            '--form',
            form,
            '--repeat',
            '0',
            '--out',
            osp.join(tmp, f'{form}_int8{ext}'),
            '--force',
            '--dump',
            dump,
            *options,
        ],
        dump,
    )


def backbones(config: str, ckpt: str, cfg_options: Optional[dict]):
    """The model's backbone in every form, and the first test image as it enters it (the
    image tools/quantize.py measures SQNR on first)."""
    from mmrepa.apis import init_model, load_config

    model = init_model(load_config(config, cfg_options), ckpt)
    x = pipeline_inputs(model.cfg, model.data_preprocessor, 1, 'test', seed=1)[0][0]
    forms = dict(unfolded=model, folded=reparameterize(copy.deepcopy(model)))
    forms['identity-apart'] = fold_identity_apart(copy.deepcopy(model))
    return {form: m.backbone for form, m in forms.items()}, torch.from_numpy(x)


def timed_variants(backbone: dict, x: torch.Tensor, tmp: str):
    """name -> call for every timed variant; compile seconds of the compiled ones."""
    threads = torch.get_num_threads()
    variants, compile_seconds = {}, {}
    for form in TORCH_FORMS:
        module = backbone[form]
        variants[(form, 'eager_ms')] = functools.partial(module, x)
        compiled = torch.compile(module)
        start = time.perf_counter()
        compiled(x)
        compile_seconds[form] = time.perf_counter() - start
        variants[(form, 'compiled_ms')] = functools.partial(compiled, x)
    for form in FORMS:
        path = osp.join(tmp, f'{form}.onnx')
        export_onnx(backbone[form], x, path)
        for key, p in (
            ('onnx_float32_ms', path),
            ('onnx_int8_ms', osp.join(tmp, f'{form}_int8.onnx')),
            ('openvino_float32_ms', path),
            ('openvino_int8_ms', osp.join(tmp, f'{form}_int8.xml')),
        ):
            session = (OpenVINOSession if 'openvino' in key else onnxruntime_session)(p, threads)
            variants[(form, key)] = functools.partial(session.run, None, {'input': x.numpy()})
    return variants, compile_seconds


@torch.no_grad()
def measure(
    config: str,
    ckpt: str,
    repeat: int,
    tmp: str,
    cfg_options: Optional[dict] = None,
    metric: bool = True,
) -> dict:
    """Every form's INT8 results (tools/quantize.py), then every latency in one interleaved
    timing (unfolded / folded eager and compiled; every form in onnxruntime float32 and INT8)."""
    options = [] if metric else ['--no-metric']
    if cfg_options:
        options += ['--cfg-options', *(f'{k}={v}'.replace(' ', '') for k, v in cfg_options.items())]
    out = dict(config=osp.relpath(config, ROOT), forms={})
    for form in FORMS:
        r = quantized(config, ckpt, form, tmp, options)
        v = quantized(config, ckpt, form, tmp, options, 'openvino')
        row = out['forms'][form] = dict(sqnr_db=r['sqnr_db'], openvino_sqnr_db=v['sqnr_db'])
        if metric:
            key = out['metric_key'] = r['metric_key']
            row.update(
                metric_float32=r['metric']['float32'][key],
                metric_int8=r['metric']['int8'][key],
                metric_drop=r['metric_drop'],
                openvino_metric_float32=v['metric']['float32'][key],
                openvino_metric_int8=v['metric']['int8'][key],
            )
        out['input_shape'] = r['input_shape']
    backbone, x = backbones(config, ckpt, cfg_options)
    assert list(x.shape) == out['input_shape'], (x.shape, out['input_shape'])
    print('  compiling and exporting', flush=True)
    variants, out['compile_seconds'] = timed_variants(backbone, x, tmp)
    print(f'  timing {len(variants)} variants, {repeat} interleaved rounds', flush=True)
    for (form, key), stats in time_interleaved(variants, repeat=repeat, warmup=10).items():
        out['forms'][form][key] = stats.median
    for row in out['forms'].values():
        row['int8_speedup'] = row['onnx_float32_ms'] / row['onnx_int8_ms']
        row['openvino_int8_speedup'] = row['openvino_float32_ms'] / row['openvino_int8_ms']
    u, f = out['forms']['unfolded'], out['forms']['folded']
    # what folding gains in each runtime (unfolded / folded time), and from the model as
    # trained (unfolded, eager float32) to the folded model in OpenVINO INT8
    out['fold_speedup'] = {k[: -len('_ms')]: u[k] / f[k] for k in f if k.endswith('_ms') and k in u}
    out['end_to_end'] = u['eager_ms'] / f['openvino_int8_ms']
    return out


def full_width_model() -> torch.nn.Module:
    """FULL_WIDTH_CONFIG at FULL_WIDTH with random weights and BatchNorm statistics away from
    0 / 1 (seeded), so that folding them changes the weights as a trained model's would."""
    from mmrepa.apis import init_model, load_config

    model = init_model(load_config(FULL_WIDTH_CONFIG, FULL_WIDTH))
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_(0, 0.1, generator=g)
            m.running_var.uniform_(0.5, 2, generator=g)
    return model


def measure_full_width(repeat: int, tmp: str) -> dict:
    """:func:`full_width_model`: latency and SQNR, no metric."""
    model = full_width_model()
    ckpt = osp.join(tmp, 'full_width.pth')
    torch.save(dict(state_dict=model.state_dict()), ckpt)
    return dict(
        measure(FULL_WIDTH_CONFIG, ckpt, repeat, tmp, FULL_WIDTH, metric=False),
        cfg_options=FULL_WIDTH,
    )


def fmt(value, spec='.2f'):
    return '–' if value is None else format(value, spec)


def table(results: dict) -> str:
    lines = [
        '| family (demo model, input) | form | eager fp32 ms | compiled fp32 ms | '
        'ORT fp32 ms | ORT INT8 ms | INT8 speed-up | INT8 SQNR dB | metric fp32 → INT8 | '
        'OV fp32 ms | OV INT8 ms | OV INT8 speed-up | OV INT8 SQNR dB | OV metric fp32 → INT8 |',
        '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    rows = [(f'{r["backbone"]} ({r["what"]}', r) for r in results['models'].values()]
    if 'full_width' in results:
        rows.append(('RePa-Swin-T widths (RetinaNet demo, random weights', results['full_width']))
    for label, r in rows:
        h, w = r['input_shape'][2:]
        for form, o in r['forms'].items():
            metric = (
                f'{o["metric_float32"]:.3f} → {o["metric_int8"]:.3f}' if 'metric_int8' in o else '–'
            )
            ov_metric = (
                f'{o["openvino_metric_float32"]:.3f} → {o["openvino_metric_int8"]:.3f}'
                if 'openvino_metric_int8' in o
                else '–'
            )
            lines.append(
                f'| {label + f", {h}×{w})" if form == FORMS[0] else ""} | {form} | '
                f'{fmt(o.get("eager_ms"))} | {fmt(o.get("compiled_ms"))} | '
                f'{o["onnx_float32_ms"]:.2f} | {o["onnx_int8_ms"]:.2f} | '
                f'{o["int8_speedup"]:.2f}× | {o["sqnr_db"]:.1f} | {metric} | '
                f'{fmt(o.get("openvino_float32_ms"))} | {fmt(o.get("openvino_int8_ms"))} | '
                f'{fmt(o.get("openvino_int8_speedup"))}× | '
                f'{fmt(o.get("openvino_sqnr_db"), ".1f")} | {ov_metric} |'
            )
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        '--out', default=osp.join(ROOT, 'benchmarks', 'results', 'deploy_table.json')
    )
    parser.add_argument(
        '--only',
        nargs='+',
        choices=[*MODELS, 'full-width'],
        help="measure these models again; the others' results in --out stay",
    )
    parser.add_argument('--repeat', type=int, default=200, help='timed rounds per measurement')
    add_demo_root_argument(parser)
    args = parser.parse_args(argv)
    args.out = osp.abspath(args.out)
    command = ' '.join([osp.relpath(osp.abspath(sys.argv[0]), ROOT), *sys.argv[1:]])
    use_demo_root(args.demo_root)
    os.chdir(args.demo_root)  # where the demo configs' relative data paths point
    import onnxruntime

    torch.set_flush_denormal(True)  # as tools/benchmark.py
    threads_from_env()
    machine = machine_info()
    results = dict(
        cpu=cpu_name(),
        torch=torch.__version__,
        onnxruntime=onnxruntime.__version__,
        omp_num_threads=os.environ['OMP_NUM_THREADS'],
        repeat=args.repeat,
        command=command,
        machine=machine,
        models={},
        skipped=[],
    )
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
                results['skipped'].append(f'{name}: no {", ".join(model.missing())}')
                continue
            print(f'{model.backbone} {model.what}', flush=True)
            config, ckpt = model.paths()
            row_machine = machine_info()
            results['models'][name] = dict(
                measure(config, ckpt, args.repeat, tmp),
                what=model.what,
                backbone=model.backbone,
                checkpoint=osp.relpath(ckpt, ROOT),
                **stamp(),
                machine=finish(row_machine),
            )
        if not args.only or 'full-width' in args.only:
            print('RePa-Swin-T widths, random weights', flush=True)
            row_machine = machine_info()
            results['full_width'] = dict(
                measure_full_width(args.repeat, tmp), **stamp(), machine=finish(row_machine)
            )
    results['models'] = {k: results['models'][k] for k in MODELS if k in results['models']}
    finish(machine)
    write_json(results, args.out)
    print(table(results))
    for s in results['skipped']:
        print('skipped:', s)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
