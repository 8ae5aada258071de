"""RePaFormer's Table 1 on a GPU: throughput of each classifier unfolded and folded.

    python benchmarks/gpu_throughput.py [--rows NAME ... | all] [--batch 128]
        [--precisions fp16 bf16] [--layouts nchw nhwc] [--modes eager graph]
        [--repeat 20] [--warmup 3] [--budget-s S] [--device cuda] [--tiny] [--out FILE]

(mmrepa importable: the editable install, or ``PYTHONPATH=.``.) On a bare GPU machine:
``bash tools/gpu/run_tier.sh`` (installs the wheels it needs, then runs this). The CPU smoke
test: ``--device cpu --tiny --batch 2 --repeat 1``.

For each row of ``ROWS`` (RePaFormer's Table 1: the paper's throughput before and after
folding, one NVIDIA RTX A6000, batch 128, 224² ImageNet images): the classifier of the row's
config (``configs/*/repa_*_in1k.py``, with the row's ``options``; random weights, every 1-D
parameter and BatchNorm statistic perturbed so that the folds have something to fold) in eval
mode, and a copy folded by ``mmrepa.fold_model`` on the device. Then:

- **verified**: the folded and unfolded logits on the first (up to) 4 images of the batch, in
  float32 with TF32 off, agree within ``VERIFY_RTOL`` of the largest logit; a row that does
  not is reported and makes the exit status 1. The difference under each autocast precision
  is recorded too (not a check: the precision's own error is as large, docs/speed.md).
- **timed**: the tensor forward (backbone, neck, head; no data preprocessing) on a random
  batch of ``--batch`` images, under ``torch.autocast`` in each of ``--precisions``, in each
  memory layout of ``--layouts`` (``nhwc``: the models' 4-D weights and the input
  channels-last), eagerly and (``--modes graph``, CUDA only) as a replayed CUDA graph (which
  removes the CPU's kernel-launch time, which bounds the small models at this batch on a fast
  GPU). For one precision all variants (unfolded / folded x layout x mode) run interleaved,
  round after round (``mmrepa.utils.time_interleaved``: CUDA events, synchronised), after
  untimed warm-up rounds; the median per variant.
- **compared**: per precision and mode, throughput folded / unfolded, each in its faster
  layout (the layout each one is faster in is printed: channels-last is kept where it helps),
  beside the paper's ratio; **met** when ours is at least the paper's. Per row the script
  prints whether every setting met it.

Parameters and MACs (``mmrepa.utils.model_complexity``, one image) before and after folding
go beside them, with the paper's.

The JSON (``--out``, written atomically after every row, ``"complete": true`` once all rows
ran) records the GPU (name, compute capability, memory, multiprocessors), the driver, torch,
its CUDA and cuDNN, the CPU side (``mmrepa.utils.machine``), every setting and every
sample. ``--budget-s`` starts no row once that many seconds have passed (the rows left are
listed as skipped). ``--tiny`` swaps every row's architecture for a tiny one of its family
(a few narrow blocks): for the smoke test on a CPU, never for numbers.

The paper does not state the precision of its throughput measurement; this script measures
float16 and bfloat16 autocast by default (``--precisions`` also takes ``fp32``, float32 with
TF32 off, and ``tf32``, with TF32 on). Two rows of the paper's table disagree with themselves
(``INCONSISTENT_ROWS``); their target is the larger ratio.
"""

import argparse
import contextlib
import copy
import datetime
import os
import os.path as osp
import platform
import shlex
import subprocess
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa.apis import init_model
from mmrepa.errors import InputError
from mmrepa.fold import fold_model
from mmrepa.integrations.cli.args import one_line_errors
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.utils import model_complexity, time_interleaved
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOL = 'benchmarks/gpu_throughput.py'
PAPER = dict(
    source='RePaFormer (Table 1: throughput before and after reparameterization)',
    gpu='NVIDIA RTX A6000',
    batch=128,
    image_size=224,
    precision='not stated',
)
VERIFY_RTOL = 1e-4  # float32, TF32 off: max |folded - unfolded| / max |unfolded|
VERIFY_IMAGES = 4
PRECISIONS = {
    'fp16': torch.float16,
    'bf16': torch.bfloat16,
    'fp32': None,  # float32, TF32 off
    'tf32': None,  # float32, TF32 matrix products and convolutions
}
LAYOUTS = ('nchw', 'nhwc')
MODES = ('eager', 'graph')


class Row(NamedTuple):
    """One row of RePaFormer's Table 1."""

    key: str  # what --rows takes
    name: str  # as the paper names it
    config: str  # the training config; its classifier, with ``options``
    paper_img_s: tuple  # (unfolded, folded) throughput, img/s, A6000, batch 128
    paper_gain_percent: float  # as printed in the table
    paper_params_m: tuple  # (unfolded, folded), millions
    paper_gmacs: tuple  # (unfolded, folded)
    options: Optional[dict] = None
    tiny: Optional[dict] = None  # --tiny: a tiny architecture of the family

    @property
    def paper_ratio_img_s(self) -> float:
        """Folded / unfolded throughput, from the two img/s of the table."""
        return self.paper_img_s[1] / self.paper_img_s[0]

    @property
    def paper_ratio(self) -> float:
        """The ratio to meet: the larger of the one from the img/s and the printed gain's (two
        rows of the table disagree with themselves: ``INCONSISTENT_ROWS``)."""
        return max(self.paper_ratio_img_s, 1 + self.paper_gain_percent / 100)


_VIT_TINY = {
    'model.backbone.arch': dict(_delete_=True, embed_dims=64, num_layers=2, num_heads=2),
    'model.head.in_channels': 64,
}
_SWIN_TINY = {
    'model.backbone.arch': dict(
        _delete_=True, embed_dims=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)
    ),
    'model.head.in_channels': 256,
}
_POOL_TINY = {
    'model.backbone.arch': dict(_delete_=True, depths=(1, 1, 1, 1), dims=(16, 32, 64, 128)),
    'model.head.in_channels': 128,
}
_MIXER_TINY = {
    'model.backbone.arch': dict(
        _delete_=True,
        embed_dims=64,
        num_layers=2,
        tokens_mlp_dims=32,
        channels_mlp_dims=256,
        patch_size=16,
    ),
    'model.head.in_channels': 64,
}
_VIT_B = 'configs/repa_vit/repa_deit_b_32xb128_in1k.py'

# RePaFormer's Table 1, every row (img/s, params, GMACs as printed). ViT-L and ViT-H have no
# config of their own: RePa-DeiT-B's classifier at their size (their ImageNet-1k configs would
# differ in the recipe only).
# fmt: off
ROWS = (
    Row('deit-t', 'RePa-DeiT-Tiny', 'configs/repa_vit/repa_deit_t_32xb128_in1k.py',
        (2333.6, 4295.0), 84.1, (5.7, 3.5), (1.1, 0.6), tiny=_VIT_TINY),
    Row('deit-s', 'RePa-DeiT-Small', 'configs/repa_vit/repa_deit_s_32xb128_in1k.py',
        (1037.1, 1975.5), 90.5, (22.1, 13.2), (4.3, 2.5), tiny=_VIT_TINY),
    Row('deit-b', 'RePa-DeiT-Base', _VIT_B,
        (336.6, 659.5), 95.9, (86.6, 51.1), (16.9, 10.6), tiny=_VIT_TINY),
    Row('vit-l', 'RePa-ViT-Large', _VIT_B,
        (102.7, 207.2), 101.8, (304.5, 178.4), (59.8, 34.9),
        {'model.backbone.arch': 'large', 'model.head.in_channels': 1024}, _VIT_TINY),
    Row('vit-h', 'RePa-ViT-Huge', _VIT_B,
        (53.0, 103.8), 95.8, (632.5, 369.9), (124.4, 72.6),
        {'model.backbone.arch': 'huge', 'model.head.in_channels': 1280}, _VIT_TINY),
    Row('swin-t', 'RePa-Swin-Tiny', 'configs/repa_swin/repa_swin_t_32xb128_in1k.py',
        (611.8, 1026.5), 59.6, (28.3, 17.5), (4.4, 2.6), tiny=_SWIN_TINY),
    Row('swin-s', 'RePa-Swin-Small', 'configs/repa_swin/repa_swin_s_32xb128_in1k.py',
        (367.6, 624.0), 69.7, (49.7, 29.9), (8.6, 5.1), tiny=_SWIN_TINY),
    Row('swin-b', 'RePa-Swin-Base', 'configs/repa_swin/repa_swin_b_32xb128_in1k.py',
        (250.1, 456.0), 82.3, (87.9, 52.8), (15.2, 9.0), tiny=_SWIN_TINY),
    Row('lvvit-s', 'RePa-LV-ViT-S', 'configs/repa_vit/repa_lvvit_s_8xb128_in1k.py',
        (725.4, 1110.9), 53.1, (26.2, 19.1), (6.1, 4.7), tiny=_VIT_TINY),
    Row('lvvit-m', 'RePa-LV-ViT-M', 'configs/repa_vit/repa_lvvit_m_8xb128_in1k.py',
        (396.6, 640.6), 61.5, (55.9, 40.1), (11.9, 8.8), tiny=_VIT_TINY),
    Row('poolformer-s12', 'RePa-PoolFormer-s12',
        'configs/poolformer/repa_poolformer_s12_32xb128_in1k.py',
        (1882.2, 3973.9), 111.1, (11.9, 6.0), (1.8, 0.8), tiny=_POOL_TINY),
    Row('poolformer-s24', 'RePa-PoolFormer-s24',
        'configs/poolformer/repa_poolformer_s24_32xb128_in1k.py',
        (957.6, 2078.4), 117.0, (21.4, 9.6), (3.4, 1.4), tiny=_POOL_TINY),
    Row('poolformer-s36', 'RePa-PoolFormer-s36',
        'configs/poolformer/repa_poolformer_s36_32xb128_in1k.py',
        (642.1, 1401.6), 119.1, (30.9, 13.1), (5.1, 2.0), tiny=_POOL_TINY),
    Row('mlpmixer-b16', 'RePa-MLPMixer-b16', 'configs/mlp_mixer/repa_mlp_mixer_b16_32xb128_in1k.py',
        (420.9, 968.4), 130.1, (59.9, 24.4), (12.7, 5.7), tiny=_MIXER_TINY),
    Row('mlpmixer-l16', 'RePa-MLPMixer-l16', 'configs/mlp_mixer/repa_mlp_mixer_l16_32xb128_in1k.py',
        (129.7, 302.7), 133.4, (208.4, 82.2), (44.7, 20.0), tiny=_MIXER_TINY),
)
# fmt: on
# Rows whose printed gain is not the ratio of their printed img/s (the paper's text, as given):
# RePa-Swin-Tiny 611.8 -> 1026.5 img/s is +67.8 %, printed +59.6 % (Table 2 has Swin-Tiny's
# 751.9 -> 1026.5, +36.5 %, consistent); RePa-PoolFormer-s36 642.1 -> 1401.6 is +118.3 %,
# printed +119.1 %. Their target is the larger ratio of the two (Row.paper_ratio).
INCONSISTENT_ROWS = ('swin-t', 'poolformer-s36')
# the rows of issue 38 (the default): one or two per family, the largest that fit the time
DEFAULT_ROWS = (
    'deit-s',
    'deit-b',
    'vit-l',
    'swin-t',
    'swin-b',
    'poolformer-s36',
    'mlpmixer-b16',
)
IMAGE_SIZE = 224  # ImageNet-1k at 224 px: the configs' test size and Table 1's MACs


def parse_args(argv=None):
    keys = [r.key for r in ROWS]
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        '--rows',
        nargs='+',
        metavar='ROW',
        default=list(DEFAULT_ROWS),
        help=f'rows of Table 1, or "all" (default: {" ".join(DEFAULT_ROWS)}); from {keys}',
    )
    parser.add_argument('--batch', type=int, default=PAPER['batch'], help='images per call')
    parser.add_argument(
        '--precisions', nargs='+', choices=sorted(PRECISIONS), default=['fp16', 'bf16']
    )
    parser.add_argument('--layouts', nargs='+', choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument(
        '--modes', nargs='+', choices=MODES, help='default: eager and graph on CUDA, eager on a CPU'
    )
    parser.add_argument('--repeat', type=int, default=20, help='timed rounds per precision')
    parser.add_argument('--warmup', type=int, default=3, help='untimed rounds first')
    parser.add_argument(
        '--budget-s', type=float, help='start no row after this many seconds (default: no limit)'
    )
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument(
        '--tiny', action='store_true', help="tiny architectures of each row's family (smoke test)"
    )
    parser.add_argument('--out', help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.rows == ['all']:
        args.rows = keys
    unknown = [r for r in args.rows if r not in keys]
    if unknown:
        raise InputError(f'--rows: unknown {unknown}; choose from {keys} or "all"')
    for option in ('batch', 'repeat'):
        if getattr(args, option) < 1:
            raise InputError(f'--{option} must be >= 1, got {getattr(args, option)}')
    if args.warmup < 0:
        raise InputError(f'--warmup must be >= 0, got {args.warmup}')
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise InputError('--device cuda: torch sees no CUDA device here; try --device cpu')
    if args.modes is None:
        args.modes = list(MODES) if device.type == 'cuda' else ['eager']
    if 'graph' in args.modes and device.type != 'cuda':
        raise InputError('--modes graph replays CUDA graphs: it needs --device cuda')
    if 'tf32' in args.precisions and device.type != 'cuda':
        raise InputError('--precisions tf32 is a CUDA setting; on a CPU use fp32')
    return args


# ------------------------------------------------------------------------------ the device


def _nvidia_smi(query: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ['nvidia-smi', f'--query-gpu={query}', '--format=csv,noheader'],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (
        out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    )


def gpu_info(device: torch.device) -> Optional[dict]:
    """The GPU and its software; None on a CPU."""
    if device.type != 'cuda':
        return None
    props = torch.cuda.get_device_properties(device)
    return dict(
        name=props.name,
        compute_capability=f'{props.major}.{props.minor}',
        memory_gib=round(props.total_memory / 2**30, 1),
        multiprocessors=props.multi_processor_count,
        driver=_nvidia_smi('driver_version'),
        nvidia_smi_name=_nvidia_smi('name'),
        torch_cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
        visible_devices=os.environ.get('CUDA_VISIBLE_DEVICES'),
    )


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 matrix products and convolutions on (``enabled``) or off, restored after."""
    matmul, conv = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, conv


def precision_context(precision: str, device: torch.device) -> Callable:
    """A factory of the context each timed call of ``precision`` runs in. Autocast's weight
    cache is off: a CUDA graph captures the casts (the eager calls cast anew too)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return lambda: tf32(precision == 'tf32')
    return lambda: torch.autocast(device.type, dtype=dtype, cache_enabled=False)


# ------------------------------------------------------------------------------ the models


@torch.no_grad()
def perturb_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every 1-D parameter moved by N(0, 0.1) and every BatchNorm given random statistics
    (``benchmarks/fold_error.py``'s): at initialisation the norms are identities, and a fold
    that dropped one would still give the same outputs."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.dim() <= 1:
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    for m in model.modules():
        if isinstance(m, _BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


def tensors(out) -> List[torch.Tensor]:
    """The tensors of a model's output (a tensor, or nested tuples / lists / dicts)."""
    if torch.is_tensor(out):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return []


def difference(ref, out) -> dict:
    """max |ref - out|, relative to max |ref|, over the outputs' tensors (float64)."""
    ref, out = tensors(ref), tensors(out)
    diff = max((r.double() - o.double()).abs().max().item() for r, o in zip(ref, out))
    scale = max(r.double().abs().max().item() for r in ref)
    finite = all(bool(torch.isfinite(t).all()) for t in ref + out)
    return dict(max_abs=diff, rel=diff / scale if scale else float('inf'), max_output=scale,
                finite=finite)  # fmt: skip


def build(row: Row, args, device: torch.device):
    """The unfolded (perturbed) and the folded classifier on ``device``, eval mode."""
    options = dict(row.options or {})
    if args.tiny:
        options.update(row.tiny or {})
    torch.manual_seed(0)
    model = init_model(osp.join(ROOT, row.config), device='cpu', cfg_options=options or None)
    model = perturb_(model).eval().to(device)
    start = time.perf_counter()
    report = fold_model(copy.deepcopy(model), logger=None)
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    fold_s = time.perf_counter() - start
    return model, report.model.eval(), report, fold_s, options


def tensor_forward(model):
    return lambda x: model(x, mode='tensor')


# ------------------------------------------------------------------------------ timing


class GraphFailed(Exception):
    pass


def graphed(fn: Callable, x: torch.Tensor, context: Callable, warmup: int = 3) -> Callable:
    """``fn(x)`` under ``context()`` captured in a CUDA graph; its replay (same input tensor).
    :class:`GraphFailed` if it cannot be captured (an op that synchronises, say)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # on a side stream, as torch.cuda.graphs asks
                with context():
                    fn(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), context():
            fn(x)
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001  what cannot be captured is timed eagerly only
        raise GraphFailed(f'{type(err).__name__}: {err}'.splitlines()[0]) from None
    return graph.replay


def variants_for(models: Dict[str, torch.nn.Module], inputs, precision, args, device):
    """name -> call, for every (model, layout, mode); the graphs that failed, with why."""
    context = precision_context(precision, device)
    calls, failed = {}, {}
    for layout in args.layouts:
        x = inputs[layout]
        for which in ('unfolded', 'folded'):
            fn = tensor_forward(models[which, layout])
            for mode in args.modes:
                name = f'{which}/{layout}/{mode}'
                if mode == 'eager':

                    def call(fn=fn, x=x):
                        with context():
                            return fn(x)

                    calls[name] = call
                    continue
                try:
                    calls[name] = graphed(fn, x, context)
                except GraphFailed as err:
                    failed[name] = str(err)
    return calls, failed


def best(stats: dict, which: str, mode: str, layouts) -> tuple:
    """(layout, median ms) of the faster layout of ``which`` in ``mode``."""
    timed = [(stats[f'{which}/{lay}/{mode}'].median, lay) for lay in layouts
             if f'{which}/{lay}/{mode}' in stats]  # fmt: skip
    if not timed:
        return None, None
    ms, layout = min(timed)
    return layout, ms


def describe_row(row: Row, model, folded, report, options: dict, device) -> dict:
    """The row's result before timing: the paper's numbers, sizes before and after the fold."""
    one = torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
    before = model_complexity(model, dict(inputs=one, data_samples=None))
    after = model_complexity(folded, dict(inputs=one, data_samples=None))
    return dict(
        name=row.name,
        config=row.config,
        options=options,
        image_size=IMAGE_SIZE,
        paper=dict(
            unfolded_img_s=row.paper_img_s[0],
            folded_img_s=row.paper_img_s[1],
            gain_percent=row.paper_gain_percent,
            ratio_from_img_s=row.paper_ratio_img_s,
            ratio_from_gain=1 + row.paper_gain_percent / 100,
            ratio=row.paper_ratio,  # the target: the larger of the two
            params_m=list(row.paper_params_m),
            gmacs=list(row.paper_gmacs),
        ),
        params_before=before['params'],
        params_after=after['params'],
        gmacs_before=before['macs'] / 1e9,
        gmacs_after=after['macs'] / 1e9,
        mac_ratio=before['macs'] / after['macs'],
        fold=dict(summary=report.summary(), not_folded=list(report.unfolded)),
    )


def verify_fold(row: Row, model, folded, check: torch.Tensor, result: dict) -> None:
    """Folded against unfolded in float32 without TF32 on ``check``, into ``result``."""
    with tf32(False):
        verify = difference(model(check, mode='tensor'), folded(check, mode='tensor'))
    verify.update(rtol=VERIFY_RTOL, images=len(check), dtype='float32', tf32=False)
    result['verify'] = verify
    result['verified'] = bool(verify['finite'] and verify['rel'] <= VERIFY_RTOL)
    print(
        f'  {row.name}: {result["params_before"] / 1e6:.1f} -> {result["params_after"] / 1e6:.1f}'
        f' M params, {result["gmacs_before"]:.2f} -> {result["gmacs_after"]:.2f} GMACs; '
        f'folded in {result["fold_s"]:.1f} s; folded vs unfolded (float32, {len(check)} images): '
        f'{verify["rel"]:.1e} of the largest logit '
        f'({"verified" if result["verified"] else "NOT VERIFIED"}, limit {VERIFY_RTOL:g})',
        flush=True,
    )


def in_layouts(model, folded, x: torch.Tensor, args):
    """({(which, layout): model}, {layout: input}): channels-last copies for nhwc."""
    models, inputs = {}, {}
    for layout in args.layouts:
        nhwc = layout == 'nhwc'
        memory_format = torch.channels_last if nhwc else torch.contiguous_format
        inputs[layout] = x.contiguous(memory_format=memory_format)
        for which, m in (('unfolded', model), ('folded', folded)):
            m = copy.deepcopy(m) if nhwc and 'nchw' in args.layouts else m
            models[which, layout] = m.to(memory_format=memory_format) if nhwc else m
    return models, inputs


def mode_run(row: Row, args, mode: str, stats: dict, failed: dict, mac_ratio: float) -> dict:
    """One precision's result in ``mode``: each layout's timings, and the faster layout's
    ratio folded / unfolded against the paper's (``met`` None if either side was not timed)."""
    run = dict(mode=mode, layouts={})
    for layout in args.layouts:
        timed = {w: stats.get(f'{w}/{layout}/{mode}') for w in ('unfolded', 'folded')}
        if None in timed.values():
            continue
        entry = {
            w: dict(median_ms=s.median, min_ms=s.min, max_ms=s.max, samples_ms=s.samples,
                    img_s=args.batch * 1e3 / s.median)
            for w, s in timed.items()
        }  # fmt: skip
        entry['ratio'] = entry['folded']['img_s'] / entry['unfolded']['img_s']
        run['layouts'][layout] = entry
    graph_errors = {k: v for k, v in failed.items() if k.endswith(f'/{mode}')}
    if graph_errors:
        run['graph_errors'] = graph_errors
    lay_u, ms_u = best(stats, 'unfolded', mode, args.layouts)
    lay_f, ms_f = best(stats, 'folded', mode, args.layouts)
    if ms_u is None or ms_f is None:
        run['met'] = None
        return run
    ratio = ms_u / ms_f
    run.update(
        unfolded=dict(layout=lay_u, img_s=args.batch * 1e3 / ms_u),
        folded=dict(layout=lay_f, img_s=args.batch * 1e3 / ms_f),
        ratio=ratio,
        paper_ratio=row.paper_ratio,
        met=ratio >= row.paper_ratio,
        speedup_over_mac_ratio=ratio / mac_ratio,
    )
    return run


def measure_row(row: Row, args, device: torch.device) -> dict:
    start = time.perf_counter()
    model, folded, report, fold_s, options = build(row, args, device)
    build_s = time.perf_counter() - start - fold_s
    result = describe_row(row, model, folded, report, options, device)
    result.update(build_s=build_s, fold_s=fold_s)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen).to(device)
    check = x[:VERIFY_IMAGES].contiguous()
    verify_fold(row, model, folded, check, result)
    models, inputs = in_layouts(model, folded, x, args)
    result['runs'] = []
    for precision in args.precisions:
        context = precision_context(precision, device)
        with context():
            check_diff = difference(model(check, mode='tensor'), folded(check, mode='tensor'))
        calls, failed = variants_for(models, inputs, precision, args, device)
        stats = time_interleaved(calls, repeat=args.repeat, warmup=args.warmup, device=device)
        for mode in args.modes:
            ratio = result['mac_ratio']
            run = dict(precision=precision, **mode_run(row, args, mode, stats, failed, ratio))
            if run['met'] is not None:
                run['autocast_difference'] = check_diff
                print(f'  {row.name}: {format_run(run)}', flush=True)
            result['runs'].append(run)
        del calls
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    runs = [r['met'] for r in result['runs'] if r['met'] is not None]
    result['met'] = bool(runs) and all(runs)
    result['seconds'] = time.perf_counter() - start
    return result


# ------------------------------------------------------------------------------ output


def format_run(run: dict) -> str:
    return (
        f'{run["precision"]} {run["mode"]:<5}  unfolded {run["unfolded"]["img_s"]:9.1f} img/s '
        f'({run["unfolded"]["layout"]}), folded {run["folded"]["img_s"]:9.1f} img/s '
        f'({run["folded"]["layout"]}): x{run["ratio"]:.3f}, paper x{run["paper_ratio"]:.3f} '
        f'-> {"met" if run["met"] else "NOT met"}'
    )


def format_table(result: dict) -> str:
    gpu = result['gpu']
    where = (
        f'{gpu["name"]} (driver {gpu["driver"]}, CUDA {gpu["torch_cuda"]}, cuDNN {gpu["cudnn"]})'
        if gpu
        else f'CPU {result["machine"]["cpu"]}, {result["machine"]["threads"]} threads'
    )
    lines = [
        f'{where}, torch {result["torch"]}, batch {result["batch"]}, {IMAGE_SIZE}x{IMAGE_SIZE}, '
        f'median of {result["repeat"]} interleaved rounds after {result["warmup"]} warm-up'
        + (' -- TINY architectures, not Table 1 models' if result['tiny'] else ''),
        f'{"row":<21}{"prec":<6}{"mode":<7}{"unfolded img/s":>16}{"folded img/s":>16}'
        f'{"ratio":>8}{"paper":>8}{"MACs":>7}  met',
    ]
    for row in result['rows'].values():
        if 'error' in row:
            lines.append(f'{row["name"]:<21}FAILED: {row["error"]}')
        for run in row['runs']:
            if run['met'] is None:
                lines.append(f'{row["name"]:<21}{run["precision"]:<6}{run["mode"]:<7}'
                             f'  no timing: {run.get("graph_errors")}')  # fmt: skip
                continue
            lines.append(
                f'{row["name"]:<21}{run["precision"]:<6}{run["mode"]:<7}'
                f'{run["unfolded"]["img_s"]:>10.1f} {run["unfolded"]["layout"]:<5}'
                f'{run["folded"]["img_s"]:>10.1f} {run["folded"]["layout"]:<5}'
                f'{run["ratio"]:>8.3f}{run["paper_ratio"]:>8.3f}{row["mac_ratio"]:>7.2f}  '
                f'{"yes" if run["met"] else "NO"}'
            )
    lines.append('per row (paper: folded / unfolded throughput of Table 1, A6000, batch 128):')
    for row in result['rows'].values():
        met = sum(bool(r['met']) for r in row['runs'])
        paper = row['paper']
        printed = f'+{paper["gain_percent"]:.1f} %'
        from_img_s = paper.get('ratio_from_img_s', paper['ratio'])
        if abs(from_img_s - paper.get('ratio_from_gain', from_img_s)) > 6e-4:
            # a row whose printed gain and img/s disagree: the larger is the target
            printed = f'the larger of +{100 * (from_img_s - 1):.1f} % from its img/s, {printed}'
        lines.append(
            f'  {row["name"]:<21} paper x{paper["ratio"]:.3f} ({printed}): '
            + ('met in every setting' if row['met'] else f'NOT met ({met} of {len(row["runs"])})')
            + ('' if row['verified'] else '; folded outputs NOT VERIFIED')
            + (f'; FAILED: {row["error"]}' if 'error' in row else '')
        )
    for key, why in result['skipped'].items():
        lines.append(f'  {key:<21} skipped: {why}')
    return '\n'.join(lines)


def run(args, argv) -> dict:
    machine = machine_info()  # the load average as the measurement starts
    device = torch.device(args.device)
    if device.type == 'cuda' and device.index is None:  # set_device needs an index
        device = torch.device('cuda', torch.cuda.current_device())
    flush = device.type == 'cpu' and torch.set_flush_denormal(True)
    if device.type == 'cuda':
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    result = dict(
        tool=TOOL,
        command='python ' + shlex.join([TOOL, *argv]),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        device=str(device),
        gpu=gpu_info(device),
        torch=torch.__version__,
        python=platform.python_version(),
        batch=args.batch,
        image_size=IMAGE_SIZE,
        precisions=args.precisions,
        layouts=args.layouts,
        modes=args.modes,
        repeat=args.repeat,
        warmup=args.warmup,
        tiny=args.tiny,
        cudnn_benchmark=device.type == 'cuda',
        flush_denormal=bool(flush),
        verify_rtol=VERIFY_RTOL,
        paper=PAPER,
        machine=machine,
        rows={},
        skipped={},
        complete=False,
    )
    start = time.perf_counter()
    rows = [r for r in ROWS if r.key in args.rows]
    try:
        with torch.no_grad():
            for i, row in enumerate(rows):
                elapsed = time.perf_counter() - start
                if args.budget_s is not None and elapsed > args.budget_s:
                    for r in rows[i:]:
                        result['skipped'][r.key] = f'--budget-s {args.budget_s:g} s spent'
                    print(
                        f'time budget spent ({elapsed:.0f} s): skipping {[r.key for r in rows[i:]]}'
                    )
                    break
                print(f'{row.name} ({row.config}{", " + str(row.options) if row.options else ""})',
                      flush=True)  # fmt: skip
                try:
                    result['rows'][row.key] = measure_row(row, args, device)
                except Exception as err:  # noqa: BLE001  (out of memory, say) the next rows still run
                    message = f'{type(err).__name__}: {err}'.splitlines()[0]
                    print(f'  {row.name}: FAILED, {message}', flush=True)
                    paper = dict(ratio=row.paper_ratio, gain_percent=row.paper_gain_percent)
                    result['rows'][row.key] = dict(
                        name=row.name,
                        config=row.config,
                        error=message,
                        verified=False,
                        met=False,
                        runs=[],
                        paper=paper,
                    )
                if args.out:  # what has been measured survives a kill
                    write_json(dict(result, machine=finish(dict(machine))), args.out)
                if device.type == 'cuda':
                    torch.cuda.empty_cache()
    finally:
        if flush:  # the process's default again (a test runs this in its process)
            torch.set_flush_denormal(False)
    result['complete'] = not result['skipped']
    result['seconds'] = time.perf_counter() - start
    finish(machine)
    return result


@one_line_errors(TOOL)
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    check_outputs(TOOL, [('--out', args.out)], [('config', osp.join(ROOT, r.config)) for r in ROWS])
    result = run(args, argv)
    print(format_table(result))
    if args.out:
        write_json(result, args.out)
    return result


def exit_status(result: dict) -> int:
    """1 if a row failed or its folded outputs were not verified; a ratio below the paper's is
    a measurement, not a failure."""
    return 0 if result and all(r['verified'] for r in result['rows'].values()) else 1


if __name__ == '__main__':
    sys.exit(exit_status(main()))
