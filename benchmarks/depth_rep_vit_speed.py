"""CPU latency of folded DepthRepViT-Tiny (6 / 4 / 3 layers) against the 12-layer ViT-Tiny.

    python benchmarks/depth_rep_vit_speed.py [--repeat 800] [--warmup 20] [--threads 1]
        [--shape 224] [--head] [--out benchmarks/results/depth_rep_vit_tiny_1thread.json]

The paper's CPU setting (its §4, Table 1): batch 1, 224², one thread, float32. The baseline is
``DepthRepViT('tiny', num_branches=1)``, a plain 12-layer ViT-Tiny with 12 heads of 16 channels
(the paper's / MAE-Lite's, its §4). For each deployed depth 6 / 4 / 3 (n = 2 / 3 / 4 branches)
and each joining mode the multi-branch model is built at λ = 1 and folded: ``join='logits'``
(the paper's network) gives heads of width n·d_h, ``join='qkv'`` a plain ViT of that depth. All
seven models (the 12-layer one folded too, so that every model runs the same deploy code) are
timed interleaved in the same rounds. Random weights (ViT init); denormals are flushed as in
``tools/benchmark.py``.

Per folded model: parameters, MACs ("full": with the attention matmuls, what
``mmrepa.utils.complexity`` counts; "paper": without them, as Table 1 counts), median / min / max
ms, speed-up = t12 / t, MACs ratio = MACs12 / MACs, speed-up / MACs ratio (target >= 0.9), latency
change against 12 layers (the paper reports -36.9 / -49.5 / -53.1 % for D-MAE-6/4/3-R against
DeiT-Tiny), and the largest difference between the folded and the unfolded (λ = 1) output. The
unfolded output is computed branch by branch (``fast_joined_forward=False``): the layers' fast
λ = 1 forward runs on weights summed by the same arithmetic as the fold, and a fold error there
would be on both sides of the difference.
"""

import argparse
import copy
import datetime
import os
import os.path as osp
import shlex
import statistics
import sys
import time

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.logging import MMLogger

from mmrepa.backbones import DepthRepViT
from mmrepa.utils import complexity, time_interleaved
from mmrepa.utils.files import write_json
from mmrepa.utils.latency import cpu_name
from mmrepa.utils.machine import finish, machine_info

DEPTHS = (6, 4, 3)
JOINS = ('logits', 'qkv')
BASELINE = '12 layers'
# the paper's Table 1: CPU (i9-9900X, 1 thread) latency change against DeiT-Tiny (66.1 ms)
PAPER_R_PERCENT = {6: -36.9, 4: -49.5, 3: -53.1}  # D-MAE-L-R (folded, the paper's network)
PAPER_PLAIN_MS = {12: 66.1, 6: 41.3, 4: 32.2, 3: 28.4}  # DeiT-Tiny and plain DeiT-6 / 4 / 3
EFFICIENCY_TARGET = 0.9


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        '--repeat', type=int, default=800, help='timed rounds (about 0.25 s each at one thread)'
    )
    parser.add_argument('--warmup', type=int, default=20, help='untimed rounds first')
    parser.add_argument('--threads', type=int, default=1, help='torch.set_num_threads')
    parser.add_argument('--shape', type=int, default=224, help='square input side')
    parser.add_argument(
        '--head',
        action='store_true',
        help='put a Linear(192, 1000) classifier on every model (default: '
        'backbones only, pooled + LayerNorm)',
    )
    parser.add_argument(
        '--keep-denormals', action='store_true', help='do not flush denormal floats to zero'
    )
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--out',
        default='benchmarks/results/depth_rep_vit_tiny_1thread.json',
        help='write the result as JSON here (empty: do not write)',
    )
    return parser.parse_args()


class Classifier(nn.Module):
    """The backbone's pooled output through a 1000-class Linear (``--head``)."""

    def __init__(self, backbone: DepthRepViT):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dims, 1000)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


class Pooled(nn.Module):
    """The backbone's single (pooled, normalized) output as a tensor."""

    def __init__(self, backbone: DepthRepViT):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        return self.backbone(x)[-1]


def build(with_head: bool, seed: int, **kwargs):
    """(unfolded at λ = 1, folded) models, in eval mode. The unfolded one computes its
    branches and their join (not the folded computation on summed weights): the reference
    the fold is checked against."""
    torch.manual_seed(seed)
    backbone = DepthRepViT('tiny', **kwargs)
    backbone.init_weights()
    for block in backbone.stages:
        block.set_join_lambda(1.0)
    model = (Classifier if with_head else Pooled)(backbone).eval()
    folded = copy.deepcopy(model)
    folded.backbone.reparameterize()
    for module in model.modules():
        if hasattr(module, 'fast_joined_forward'):
            module.fast_joined_forward = False
    return model, folded


def macs_paper(model: nn.Module, x: torch.Tensor) -> int:
    """The paper's convention (its Table 1 FLOPs): mmengine's count without the attention
    matmuls (it has no handle for scaled_dot_product_attention)."""
    analyzer = FlopAnalyzer(model, (x,))
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer.total()


def spread(samples):
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return q1, q3


def build_all(args, x: torch.Tensor):
    """Every model folded ({name: model}), with its sizes and fold error ({name: info})."""
    specs = {BASELINE: dict(num_branches=1)}
    for depth in DEPTHS:
        for join in JOINS:
            specs[f'{depth} layers, {join}'] = dict(depth=depth, join=join)
    models, info = {}, {}
    for name, kwargs in specs.items():
        unfolded, folded = build(args.head, args.seed, **kwargs)
        with torch.inference_mode():
            ref, out = unfolded(x), folded(x)
        c = complexity(folded, (x,))
        block = folded.backbone.stages[0].attn
        info[name] = dict(
            depth=folded.backbone.depth,
            branches=folded.backbone.num_branches,
            join=kwargs.get('join', 'logits') if folded.backbone.num_branches > 1 else None,
            heads=block.num_heads,
            head_dim=block.folded_width // block.num_heads,
            params=c['params'],
            params_unfolded=complexity(unfolded, (x,))['params'],
            macs_full=c['macs'],
            macs_paper=macs_paper(folded, x),
            fold_max_abs_diff=(out - ref).abs().max().item(),
            output_max_abs=ref.abs().max().item(),
        )
        models[name] = folded
        print(
            f'{name:<18} {c["params"] / 1e6:6.2f} M params, {c["macs"] / 1e6:7.1f} M MACs, '
            f'fold max |diff| {info[name]["fold_max_abs_diff"]:.1e}',
            flush=True,
        )
    return models, info


def time_all(args, models: dict, x: torch.Tensor):
    """The models timed interleaved: (stats, machine, load averages before and after, seconds)."""

    def progress(done, total):
        if done % max(1, total // 10) == 0 or done == total:
            print(f'  {done}/{total} rounds', flush=True)

    machine = machine_info()  # CPU, vector extensions, threads; the load as timing starts
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with torch.inference_mode():
        stats = time_interleaved(
            {k: (lambda m=m: m(x)) for k, m in models.items()},
            repeat=args.repeat,
            warmup=args.warmup,
            progress=progress,
        )
    elapsed = time.perf_counter() - t0
    load_after = os.getloadavg()
    finish(machine)
    return stats, machine, load_before, load_after, elapsed


def compare(stats: dict, info: dict) -> dict:
    """Per model: its latency, and its speed-up and MACs ratio against the 12 layers."""
    base = stats[BASELINE].median
    base_full, base_paper = info[BASELINE]['macs_full'], info[BASELINE]['macs_paper']
    results = {}
    for name, s in stats.items():
        r = info[name]
        q1, q3 = spread(s.samples)
        r.update(
            median_ms=s.median,
            min_ms=s.min,
            max_ms=s.max,
            q1_ms=q1,
            q3_ms=q3,
            gmacs=r['macs_full'] / 1e9,
            gmacs_paper=r['macs_paper'] / 1e9,
        )
        if name != BASELINE:
            speedup = base / s.median
            ratio, ratio_paper = base_full / r['macs_full'], base_paper / r['macs_paper']
            r.update(
                speedup=speedup,
                latency_change_percent=100.0 * (1 / speedup - 1),
                gmacs_ratio=ratio,
                speedup_over_gmacs_ratio=speedup / ratio,
                target_met=speedup / ratio >= EFFICIENCY_TARGET,
                gmacs_ratio_paper=ratio_paper,
                speedup_over_gmacs_ratio_paper=speedup / ratio_paper,
                paper_latency_change_percent=(
                    PAPER_R_PERCENT[r['depth']] if r['join'] == 'logits' else None
                ),
                paper_plain_latency_change_percent=100.0
                * (PAPER_PLAIN_MS[r['depth']] / PAPER_PLAIN_MS[12] - 1),
            )
        results[name] = r
    return results


def run(args):
    torch.set_num_threads(args.threads)
    flush = not args.keep_denormals and torch.set_flush_denormal(True)
    MMLogger.get_current_instance().setLevel('WARNING')  # init_weights lists every tensor
    x = torch.randn(1, 3, args.shape, args.shape)
    models, info = build_all(args, x)
    stats, machine, load_before, load_after, elapsed = time_all(args, models, x)
    results = compare(stats, info)
    return dict(
        benchmark='depth_rep_vit_speed',
        command=shlex.join([osp.relpath(sys.executable), *sys.argv]),
        date=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
        device='cpu',
        device_name=cpu_name(),
        threads=torch.get_num_threads(),
        flush_denormal=bool(flush),
        dtype=str(x.dtype),
        shape=[args.shape, args.shape],
        batch=1,
        repeat=args.repeat,
        warmup=args.warmup,
        seed=args.seed,
        torch=torch.__version__,
        outputs=(
            'Linear(192, 1000) head on the pooled output'
            if args.head
            else "backbone only: out_type='avg' (patch mean + LayerNorm), no head"
        ),
        baseline="DepthRepViT('tiny', num_branches=1) folded: plain 12-layer ViT-Tiny, 12 heads "
        'of 16 (the paper compares against DeiT-Tiny; its §4)',
        macs_conventions={
            'gmacs': 'full: linear/conv matmuls + attention QK^T and AV (SDPA) + 5/elem per '
            'affine LN (mmrepa.utils.complexity)',
            'gmacs_paper': 'paper: the same without the attention matmuls (Table 1 of the paper)',
        },
        efficiency_target=EFFICIENCY_TARGET,
        load_average_before=list(load_before),
        load_average_after=list(load_after),
        timing_seconds=elapsed,
        machine=machine,
        models=results,
    )


def format_table(result):
    lines = [
        f'{result["device_name"]}, {result["threads"]} thread(s), {result["dtype"]}, '
        f'batch 1, {result["shape"][0]}x{result["shape"][1]}, {result["repeat"]} '
        f'interleaved rounds; {result["outputs"]}',
        f'{"model":<18}{"params M":>9}{"GMACs":>7}{"ms":>8}{"q1":>7}{"q3":>7}'
        f'{"speed-up":>9}{"MACs x":>7}{"eff.":>6}{"latency":>9}{"paper":>8}{"fold err":>9}',
    ]
    for name, r in result['models'].items():
        line = (
            f'{name:<18}{r["params"] / 1e6:>9.2f}{r["gmacs"]:>7.3f}{r["median_ms"]:>8.2f}'
            f'{r["q1_ms"]:>7.2f}{r["q3_ms"]:>7.2f}'
        )
        if 'speedup' in r:
            paper = r['paper_latency_change_percent']
            line += (
                f'{r["speedup"]:>9.3f}{r["gmacs_ratio"]:>7.3f}'
                f'{r["speedup_over_gmacs_ratio"]:>6.2f}'
                f'{r["latency_change_percent"]:>8.1f}%'
                f'{"" if paper is None else f"{paper:.1f}%":>8}'
            )
        else:
            line += f'{"":>9}{"":>7}{"":>6}{"":>9}{"":>8}'
        line += f'{r["fold_max_abs_diff"]:>9.1e}'
        lines.append(line)
    met = [n for n, r in result['models'].items() if r.get('target_met')]
    missed = [n for n, r in result['models'].items() if r.get('target_met') is False]
    lines.append(
        f'speed-up / MACs ratio >= {result["efficiency_target"]}: met by '
        f'{", ".join(met) or "none"}; missed by {", ".join(missed) or "none"}'
    )
    return '\n'.join(lines)


def main():
    args = parse_args()
    result = run(args)
    print(format_table(result))
    if args.out:
        write_json(result, args.out)
        print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
