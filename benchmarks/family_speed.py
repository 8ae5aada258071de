"""Folding speed-up of each family's classifier against its MAC ratio, beside the paper's gain.

    python benchmarks/family_speed.py [--models NAME ...] [--repeat 20] [--warmup 3]
        [--batches 1 16] [--threads 1 2] [--out benchmarks/results/family_speed.json]

For each model of ``MODELS``: the classifier of its (training) config (with the row's
``options``) with random weights (no checkpoint), in eval mode, and a copy folded by
``mmrepa.reparameterize``; the tensor forward (backbone, neck, head; no data preprocessing) of
both on a random batch at 224², timed interleaved in this process
(``mmrepa.utils.time_interleaved``, untimed warm-up rounds first, denormals flushed as
``tools/benchmark.py`` does), for every batch size and thread count (``torch.set_num_threads``).
Per run: median / min / max ms per call, the speed-up (unfolded median / folded median), the MAC
ratio (``mmrepa.utils.complexity``, one image) and the speed-up / MAC ratio, whose target is at
least 0.95 at batch 16: folding should buy nearly all the arithmetic it removes. The papers
report GPU throughput (RePaFormer: an A6000 at batch 128), so their gain is a reference, not a
target.

The JSON (written atomically) records the machine (CPU model, vector extensions, threads,
load at the start and the end); the machine is shared, so only the ratios, measured
interleaved, compare across runs.
"""

import argparse
import copy
import datetime
import os.path as osp
import shlex
import sys
from typing import NamedTuple, Optional

import torch

import mmrepa
from mmrepa.apis import init_model
from mmrepa.errors import InputError
from mmrepa.integrations.cli.args import one_line_errors
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.utils import model_complexity, time_interleaved
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info

TOOL = 'benchmarks/family_speed.py'
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SHAPE = (224, 224)
TARGET = 0.95  # speed-up / MAC ratio at batch 16


class Model(NamedTuple):
    name: str
    config: str  # the training config; the folded model is a folded copy of its classifier
    paper_gain_percent: Optional[float]  # throughput gain of folding the paper reports
    paper_source: str
    # changes to the config (mmengine's cfg_options), for a RePa model without a config of its own
    options: Optional[dict] = None


# One line per model: a new family adds one.
MODELS = (
    Model(
        'RePa-MLPMixer-B16',
        'configs/mlp_mixer/repa_mlp_mixer_b16_32xb128_in1k.py',
        130.1,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-Swin-T',
        'configs/repa_swin/repa_swin_t_32xb128_in1k.py',
        59.6,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-DeiT-T',
        'configs/repa_vit/repa_deit_t_32xb128_in1k.py',
        84.1,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-DeiT-S',
        'configs/repa_vit/repa_deit_s_32xb128_in1k.py',
        90.5,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-DeiT-B',
        'configs/repa_vit/repa_deit_b_32xb128_in1k.py',
        95.9,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-LV-ViT-S',
        'configs/repa_vit/repa_lvvit_s_8xb128_in1k.py',
        53.1,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-PoolFormer-S12',
        'configs/poolformer/repa_poolformer_s12_32xb128_in1k.py',
        111.1,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'RePa-PoolFormer-S36',
        'configs/poolformer/repa_poolformer_s36_32xb128_in1k.py',
        119.1,
        'RePaFormer Table 1 (A6000, batch 128)',
    ),
    Model(
        'PRepBN-DeiT-T',
        'configs/prepbn_vit/prepbn_deit_t_8xb128_in1k.py',
        None,
        'SLAB reports no folded/unfolded throughput',
    ),
    Model(
        'PRepBN-PVT-T',
        'configs/prepbn_pvt/prepbn_pvt_t_8xb128_in1k.py',
        None,
        'SLAB reports no folded/unfolded throughput',
    ),
    Model(
        'SLAB-PVT-T',
        'configs/prepbn_pvt/slab_pvt_t_8xb128_in1k.py',
        None,
        'SLAB reports no folded/unfolded throughput',
    ),
    Model(
        'RePa-CAFormer-S18',
        'configs/metaformer/repa_caformer_s18_32xb128_in1k.py',
        None,
        'no paper trains it',
    ),
    Model(
        'RePa-ConvFormer-S18',
        'configs/metaformer/repa_convformer_s18_32xb128_in1k.py',
        None,
        'no paper trains it',
    ),
    # the MetaFormer baselines with RePa MLPs at the idle ratio the RePa MetaFormer configs use
    # (RePaFormer's default 0.75): no config of their own, no paper trains them
    Model(
        'RePa-IdentityFormer-S12',
        'configs/metaformer/identityformer_s12_32xb128_in1k.py',
        None,
        'no paper trains it',
        {'model.backbone.idle_ratio': 0.75},
    ),
    Model(
        'RePa-RandFormer-S12',
        'configs/metaformer/randformer_s12_32xb128_in1k.py',
        None,
        'no paper trains it',
        {'model.backbone.idle_ratio': 0.75},
    ),
    Model(
        'RePa-PoolFormerV2-S12',
        'configs/poolformer/poolformerv2_s12_32xb128_in1k.py',
        None,
        'no paper trains it',
        {'model.backbone.idle_ratio': 0.75},
    ),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        '--models', nargs='+', metavar='NAME', help='a subset of the table (default: all)'
    )
    parser.add_argument('--repeat', type=int, default=20, help='timed rounds per run')
    parser.add_argument('--warmup', type=int, default=3, help='untimed rounds first')
    parser.add_argument('--batches', type=int, nargs='+', default=[1, 16])
    parser.add_argument('--threads', type=int, nargs='+', default=[1, 2])
    parser.add_argument(
        '--out',
        default='benchmarks/results/family_speed.json',
        help='write the result as JSON here (empty: do not write)',
    )
    args = parser.parse_args(argv)
    names = [m.name for m in MODELS]
    unknown = [n for n in args.models or () if n not in names]
    if unknown:
        raise InputError(f'--models: unknown {unknown}; choose from {names}')
    for option in ('batches', 'threads'):
        if min(getattr(args, option)) < 1:
            raise InputError(f'--{option} must be integers >= 1, got {getattr(args, option)}')
    return args


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def measure_model(entry: Model, args) -> dict:
    """Build, fold, count and time one model; its JSON row."""
    # eval mode, random weights
    model = init_model(osp.join(ROOT, entry.config), device='cpu', cfg_options=entry.options)
    folded = mmrepa.reparameterize(copy.deepcopy(model))
    one = torch.randn(1, 3, *SHAPE)
    before = model_complexity(model, dict(inputs=one, data_samples=None))
    after = model_complexity(folded, dict(inputs=one, data_samples=None))
    mac_ratio = before['macs'] / after['macs']
    row = dict(
        config=entry.config,
        options=entry.options,
        paper_gain_percent=entry.paper_gain_percent,
        paper_source=entry.paper_source,
        params_before=_params(model),
        params_after=_params(folded),
        gmacs_before=before['macs'] / 1e9,
        gmacs_after=after['macs'] / 1e9,
        mac_ratio=mac_ratio,
        runs=[],
    )
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batches:
            x = torch.randn(batch, 3, *SHAPE)
            stats = time_interleaved(
                dict(
                    unfolded=lambda x=x: model(x, mode='tensor'),
                    folded=lambda x=x: folded(x, mode='tensor'),
                ),
                repeat=args.repeat,
                warmup=args.warmup,
            )
            speedup = stats['unfolded'].median / stats['folded'].median
            run = dict(threads=threads, batch=batch)
            for name, s in stats.items():
                run[name] = dict(median_ms=s.median, min_ms=s.min, max_ms=s.max)
            run.update(speedup=speedup, speedup_over_mac_ratio=speedup / mac_ratio)
            row['runs'].append(run)
            print(f'  {entry.name}: {format_run(run)}', flush=True)
    return row


def format_run(run: dict) -> str:
    return (
        f'batch {run["batch"]:>2}, {run["threads"]} thread(s): '
        f'{run["unfolded"]["median_ms"]:.1f} -> {run["folded"]["median_ms"]:.1f} ms, '
        f'speed-up {run["speedup"]:.3f}, / MAC ratio {run["speedup_over_mac_ratio"]:.3f}'
    )


def format_table(result: dict) -> str:
    machine = result['machine']
    lines = [
        f'{machine["cpu"]} ({machine["torch_cpu_capability"]} kernels), load '
        f'{machine["load_average_start"]} -> {machine["load_average_end"]}, '
        f'{SHAPE[0]}x{SHAPE[1]}, repeat {result["repeat"]}',
        f'{"model":<25}{"batch":>6}{"thr":>4}{"unfolded ms":>13}{"folded ms":>11}'
        f'{"speed-up":>10}{"MAC ratio":>11}{"ratio":>7}{"params M":>16}{"paper gain":>12}',
    ]
    for name, row in result['models'].items():
        gain = row['paper_gain_percent']
        for run in row['runs']:
            flag = (
                ' (< target)'
                if run['batch'] == 16 and run['speedup_over_mac_ratio'] < TARGET
                else ''
            )
            lines.append(
                f'{name:<25}{run["batch"]:>6}{run["threads"]:>4}'
                f'{run["unfolded"]["median_ms"]:>13.1f}{run["folded"]["median_ms"]:>11.1f}'
                f'{run["speedup"]:>10.3f}{row["mac_ratio"]:>11.3f}'
                f'{run["speedup_over_mac_ratio"]:>7.3f}'
                f'{row["params_before"] / 1e6:>8.1f} -> {row["params_after"] / 1e6:<5.1f}'
                f'{"" if gain is None else f"+{gain:.1f} %":>11}{flag}'
            )
    lines.append(
        f'speed-up = unfolded / folded median; ratio = speed-up / MAC ratio, target >= {TARGET} '
        'at batch 16; paper gain: GPU throughput, for reference'
    )
    return '\n'.join(lines)


def run(args, argv) -> dict:
    machine = machine_info()  # the load average as the measurement starts
    entries = [m for m in MODELS if not args.models or m.name in args.models]
    threads, flush = torch.get_num_threads(), torch.set_flush_denormal(True)
    result = dict(
        command='python ' + shlex.join([TOOL, *argv]),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        shape=list(SHAPE),
        batches=args.batches,
        thread_counts=args.threads,
        repeat=args.repeat,
        warmup=args.warmup,
        flush_denormal=bool(flush),
        target_speedup_over_mac_ratio=TARGET,
        machine=machine,
        models={},
    )
    try:
        with torch.no_grad():
            for entry in entries:
                print(f'{entry.name} ({entry.config})', flush=True)
                result['models'][entry.name] = measure_model(entry, args)
    finally:
        torch.set_num_threads(threads)
    finish(machine)
    return result


@one_line_errors(TOOL)
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    check_outputs(
        TOOL, [('--out', args.out)], [('config', osp.join(ROOT, m.config)) for m in MODELS]
    )
    result = run(args, argv)
    print(format_table(result))
    if args.out:
        write_json(result, args.out)
    return result


if __name__ == '__main__':
    sys.exit(0 if main() else 1)
