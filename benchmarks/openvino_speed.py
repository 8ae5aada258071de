"""The full-width RePa-Swin-T backbone from training to the folded OpenVINO INT8 model.

    OMP_NUM_THREADS=1 python benchmarks/openvino_speed.py [--sizes 224 640] [--repeat 20]
        [--calib-images 8] [--out benchmarks/results/openvino_repa_swin_t.json]

The demo RetinaNet's backbone built at RePa-Swin-T's widths (96-768 channels, as
benchmarks/deploy_table.py's ``full-width`` row), random weights and BatchNorm statistics, unfolded
(as trained) and folded (mmrepa.reparameterize), per square input size: exported to ONNX and run
in eager PyTorch, ONNX Runtime and OpenVINO float32, and OpenVINO INT8 (NNCF post-training,
calibrated on ``--calib-images`` random normal images, SQNR against OpenVINO float32 on 4
others), all timed in one process, interleaved (A B C ... A B C ...), medians. Reports the
end-to-end ratio (unfolded eager float32 -> folded OpenVINO INT8), the fold's speed-up in each
runtime next to its MAC ratio, OpenVINO INT8 against OpenVINO and ONNX Runtime float32, and
OpenVINO's per-op-type time (its performance counters) unfolded and folded, float32 and INT8:
where the time goes when folding gains less than the MACs it removes. Random weights: the SQNR
says nothing about accuracy (benchmarks/quantize_demo_models.py measures that on trained demo
models). One thread (OMP_NUM_THREADS, default 1) for every runtime; the JSON holds the machine
(CPU, vector extensions, load at start and end).
"""

import argparse
import collections
import copy
import functools
import os
import os.path as osp
import sys
import tempfile

import numpy as np
import torch

from mmrepa import reparameterize
from mmrepa.integrations.onnx import export_onnx, onnxruntime_session
from mmrepa.integrations.openvino import (
    OpenVINOSession,
    op_counts,
    quantize_nncf,
    read_model,
    save_ir,
)
from mmrepa.integrations.quantize import sqnr_db
from mmrepa.utils.complexity import complexity
from mmrepa.utils.files import write_json
from mmrepa.utils.latency import time_interleaved
from mmrepa.utils.machine import finish, machine_info

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from demo_models import ROOT, threads_from_env  # noqa: E402
from deploy_table import full_width_model  # noqa: E402

FORMS = ('unfolded', 'folded')


def full_width_backbone():
    torch.manual_seed(0)
    unfolded = full_width_model().backbone.eval()
    return dict(unfolded=unfolded, folded=reparameterize(copy.deepcopy(unfolded)))


def op_profile(path: str, x: np.ndarray, threads: int, runs: int = 5) -> dict:
    """OpenVINO's time per op type (ms per run, summed over its nodes, most first) with the
    kernels that ran them (exec type: e.g. ``brgconv_avx2_I8``, ``jit_avx2_FP32``), from its
    performance counters, on the model at ``path`` compiled separately for this."""
    import openvino as ov

    from mmrepa.integrations.openvino import signal_stack_kept

    config = {'INFERENCE_PRECISION_HINT': 'f32', 'PERF_COUNT': True}
    if threads:
        config['INFERENCE_NUM_THREADS'] = threads
    with signal_stack_kept():
        request = ov.Core().compile_model(path, 'CPU', config).create_infer_request()
    request.infer([x])  # warm-up
    times, kernels = collections.Counter(), collections.defaultdict(collections.Counter)
    for _ in range(runs):
        request.infer([x])
        for info in request.profiling_info:
            ms = info.real_time.total_seconds() * 1e3
            times[info.node_type] += ms / runs
            kernels[info.node_type][info.exec_type] += 1
    total = sum(times.values())
    return dict(
        total_ms=total,
        by_op={
            op: dict(ms=ms, share=ms / total if total else None, kernels=dict(kernels[op]))
            for op, ms in times.most_common(12)
        },
    )


@torch.no_grad()
def eager_profile(module, x: torch.Tensor, runs: int = 3) -> dict:
    """PyTorch's self CPU time per aten op (ms per run, most first, the top 12), from its
    profiler, after one warm-up run."""
    module(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            module(x)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / runs / 1e3
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return dict(
        total_ms=total,
        by_op={
            e.key: dict(ms=e.self_cpu_time_total / runs / 1e3, calls=e.count // runs) for e in top
        },
    )


@torch.no_grad()
def measure(backbones: dict, size: int, repeat: int, calib_images: int, tmp: str) -> dict:
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(size)
    x = torch.randn(1, 3, size, size, generator=g)
    calib = [
        (torch.randn(1, 3, size, size, generator=g).numpy(), 'random') for _ in range(calib_images)
    ]
    tests = [torch.randn(1, 3, size, size, generator=g).numpy() for _ in range(4)]
    row = dict(input_shape=list(x.shape), forms={})
    variants = {}
    for form in FORMS:
        module = backbones[form]
        out = row['forms'][form] = complexity(module, (x,))
        onnx_path = osp.join(tmp, f'{form}_{size}.onnx')
        export_onnx(module, x, onnx_path)
        print(f'  {size}: {form}: NNCF INT8 on {len(calib)} random images', flush=True)
        int8 = quantize_nncf(read_model(onnx_path), calib)
        int8_path = osp.join(tmp, f'{form}_{size}_int8.xml')
        save_ir(int8, int8_path)
        out['int8_fake_quantize'] = op_counts(int8).get('FakeQuantize', 0)
        ort = onnxruntime_session(onnx_path, threads)
        ov32, ov8 = OpenVINOSession(onnx_path, threads), OpenVINOSession(int8_path, threads)
        ref = [o for t in tests for o in ov32.run(None, {'input': t})]
        out['int8_sqnr_db_random_weights'] = sqnr_db(
            ref, [o for t in tests for o in ov8.run(None, {'input': t})]
        )
        with torch.no_grad():
            torch_out = [t.numpy() for t in module(torch.from_numpy(tests[0]))]
        out['openvino_fp32_max_abs_error'] = max(
            float(np.abs(a - b).max())
            for a, b in zip(torch_out, ov32.run(None, {'input': tests[0]}))
        )
        a = x.numpy()
        variants[(form, 'eager_fp32_ms')] = functools.partial(module, x)
        variants[(form, 'ort_fp32_ms')] = functools.partial(ort.run, None, {'input': a})
        variants[(form, 'openvino_fp32_ms')] = functools.partial(ov32.run, None, {'input': a})
        variants[(form, 'openvino_int8_ms')] = functools.partial(ov8.run, None, {'input': a})
        out['profile'] = {
            'openvino_fp32': op_profile(onnx_path, a, threads),
            'openvino_int8': op_profile(int8_path, a, threads),
        }
    print(f'  {size}: timing {len(variants)} variants, {repeat} interleaved rounds', flush=True)
    for (form, key), stats in time_interleaved(variants, repeat=repeat, warmup=3).items():
        row['forms'][form][key] = stats.median
    u, f = row['forms']['unfolded'], row['forms']['folded']
    row['ratios'] = dict(
        end_to_end=u['eager_fp32_ms'] / f['openvino_int8_ms'],
        mac_ratio=u['macs'] / f['macs'],
        fold_speedup={
            k[: -len('_ms')]: u[k] / f[k]
            for k in ('eager_fp32_ms', 'ort_fp32_ms', 'openvino_fp32_ms', 'openvino_int8_ms')
        },
        openvino_int8_vs_openvino_fp32=f['openvino_fp32_ms'] / f['openvino_int8_ms'],
        openvino_int8_vs_ort_fp32=f['ort_fp32_ms'] / f['openvino_int8_ms'],
        openvino_int8_vs_eager_folded=f['eager_fp32_ms'] / f['openvino_int8_ms'],
    )
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--sizes', nargs='+', type=int, default=[224, 640])
    parser.add_argument('--repeat', type=int, default=20)
    parser.add_argument('--calib-images', type=int, default=8)
    parser.add_argument(
        '--eager-profile',
        action='store_true',
        help="only PyTorch eager's profile per aten op, unfolded and folded (to --out)",
    )
    parser.add_argument(
        '--out', default=osp.join(ROOT, 'benchmarks', 'results', 'openvino_repa_swin_t.json')
    )
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)  # as tools/benchmark.py
    threads_from_env()
    machine = machine_info()
    results = dict(
        command=' '.join([osp.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        omp_num_threads=os.environ['OMP_NUM_THREADS'],
        repeat=args.repeat,
        calib_images=args.calib_images,
        machine=machine,
        sizes={},
    )
    backbones = full_width_backbone()
    if args.eager_profile:
        for size in args.sizes:
            x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(size))
            results['sizes'][str(size)] = {
                form: eager_profile(backbones[form], x) for form in FORMS
            }
        write_json(dict(results, machine=finish(machine)), args.out)
        print(f'wrote {args.out}')
        return
    with tempfile.TemporaryDirectory(prefix='mmrepa.openvino_speed.') as tmp:
        for size in args.sizes:
            results['sizes'][str(size)] = measure(
                backbones, size, args.repeat, args.calib_images, tmp
            )
            write_json(dict(results, machine=dict(machine)), args.out)  # each size as it is done
    finish(machine)
    write_json(results, args.out)
    for size, row in results['sizes'].items():
        r, f = row['ratios'], row['forms']
        for form in FORMS:
            times = ', '.join(f'{k[:-3]} {v:.1f}' for k, v in f[form].items() if k.endswith('_ms'))
            print(f'{size}² {form} (ms): {times}')
        speedups = ', '.join(f'{k} {v:.2f}x' for k, v in r['fold_speedup'].items())
        print(
            f'  end to end {r["end_to_end"]:.2f}x; MAC ratio {r["mac_ratio"]:.2f}; '
            f'fold speed-up: {speedups}'
        )
        print(
            f'  OpenVINO INT8 vs OpenVINO fp32 {r["openvino_int8_vs_openvino_fp32"]:.2f}x, '
            f'vs ORT fp32 {r["openvino_int8_vs_ort_fp32"]:.2f}x'
        )
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
