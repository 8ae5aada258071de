"""Post-training static INT8 quantization (onnxruntime QDQ, or OpenVINO with NNCF) of a folded
backbone or detector.

    python tools/quantize.py CONFIG CHECKPOINT [--backend onnxruntime|openvino] [--max-drop D]
        [--full] [--form FORM] [--shape H W]
        [--calib-images N] [--calib-split train|test] [--method minmax|entropy|percentile]
        [--activation-type uint8|int8] [--per-tensor] [--reduce-range auto|on|off]
        [--symmetric-activations] [--exclude-ops OP [OP ...]] [--no-metric] [--report]
        [--repeat R] [--out model_int8.onnx] [--force] [--dump result.json]

The model is folded, its backbone (``--full``: a single-stage detector's tensor forward, as
``tools/export_onnx.py --full`` exports it) exported to ONNX for the input shape the config's
test pipeline gives, and quantized with onnxruntime's ``quantize_static``: QDQ format, INT8
weights with one scale per output channel, activations calibrated (--method) on
--calib-images images of the config's train split read through its test pipeline and the
model's data preprocessor. ``--form``: ``identity-apart`` (default) folds as
``mmrepa.reparameterize`` but keeps identity shortcuts out of the weights (RepVGG layers,
channel-idle FFNs), which INT8 needs; ``folded`` is the plain fold; ``unfolded`` the model as
trained. ``--backend openvino``: the same float32 ONNX graph is read by OpenVINO and quantized
by NNCF's post-training quantization (INT8 weights per output channel, activations calibrated on
the same images; the onnxruntime options --method ... --exclude-ops do not apply), written as
OpenVINO IR (``.xml`` and the ``.bin`` beside it); with ``--max-drop D`` NNCF's accuracy control
keeps the config's test metric (mAP, top-1, ...) within D (absolute, in the metric's units) of
float32's, returning the layers that cost most to float. Reported:

- SQNR (dB) of the INT8 outputs against the float32 graph's, on test images;
- the metric (mAP, top-1, ...) on the test set with the float32 and with the INT8 graph in
  the backend (the rest of the model, necks, heads and post-processing, in PyTorch);
- float32 and INT8 latency in the backend, timed interleaved (as many threads as torch);
- with ``--report``: every form's SQNR, and per module its weight ranges (ONNX initializers)
  and activation ranges (calibration) unfolded, folded and identity-apart, so the fold that
  widened a range shows.

Calibration data that does not match the exported input (``--shape`` other than the pipeline's,
or a pipeline giving several sizes) is refused before anything is written; the INT8 file and
``--dump`` are written atomically, never half. Neither may be an input (the config, the
checkpoint, the calibration and test data) or a link to one, even with --force; this is checked
first.
"""

import argparse
import copy
import os.path as osp
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, List, Tuple

import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model, load_config
from mmrepa.config.inputs import config_inputs
from mmrepa.errors import ConfigError
from mmrepa.fold import is_foldable
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.inputs import check_inputs
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.integrations.onnx import (
    TensorForward,
    export_onnx,
    flatten_outputs,
    onnx_max_abs_error,
    onnxruntime_session,
)
from mmrepa.integrations.openvino import (
    OpenVINOSession,
    op_counts,
    quantize_nncf,
    read_model,
    save_ir,
)
from mmrepa.integrations.optional import require
from mmrepa.integrations.quantize import (
    CALIBRATION_METHODS,
    SessionModel,
    check_inputs_shape,
    config_metric,
    fold_identity_apart,
    fold_range_report,
    metric_loader,
    needs_reduce_range,
    pipeline_inputs,
    qdq_summary,
    quantize_qdq,
    sqnr_db,
    weighted_layers,
)
from mmrepa.utils.files import write_json
from mmrepa.utils.latency import time_interleaved
from mmrepa.utils.machine import finish, machine_info
from mmrepa.utils.progress import step

TOOL = 'tools/quantize.py'
FORMS = ('unfolded', 'folded', 'identity-apart')
# what each backend needs installed, and the INT8 file it writes
BACKENDS = {
    'onnxruntime': (('onnx', 'onnxruntime'), '.onnx'),
    'openvino': (('onnx', 'openvino', 'nncf'), '.xml'),
}


def open_session(path: str, backend: str, threads: int = 0):
    """A session of the ONNX or IR file in ``backend``, with onnxruntime's interface."""
    if backend == 'openvino':
        return OpenVINOSession(path, threads)
    return onnxruntime_session(path, threads)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', action=ConfigPath)
    parser.add_argument('checkpoint')
    parser.add_argument(
        '--backend',
        choices=tuple(BACKENDS),
        default='onnxruntime',
        help='onnxruntime (QDQ) or openvino (NNCF, OpenVINO IR)',
    )
    parser.add_argument(
        '--max-drop',
        type=float,
        metavar='D',
        help="openvino: NNCF's accuracy control, at most D (absolute) lost on the test metric",
    )
    parser.add_argument(
        '--full',
        action='store_true',
        help="quantize a single-stage detector's tensor forward, not the backbone",
    )
    parser.add_argument(
        '--form',
        choices=FORMS,
        default='identity-apart',
        help='identity-apart: folded with identity shortcuts kept out of the '
        'weights; folded: mmrepa.reparameterize; unfolded: as trained',
    )
    parser.add_argument(
        '--shape',
        nargs=2,
        type=int,
        metavar=('H', 'W'),
        help="input shape to export for (default: the test pipeline's)",
    )
    add_calibration_arguments(parser)
    add_measurement_arguments(parser)
    return parser.parse_args(argv)


def add_calibration_arguments(parser) -> None:
    """How the INT8 graph is calibrated and quantized (onnxruntime; NNCF has its own)."""
    parser.add_argument('--calib-images', type=int, default=64, metavar='N')
    parser.add_argument(
        '--calib-split',
        choices=('train', 'test'),
        default='train',
        help='images to calibrate on, read through the test pipeline',
    )
    parser.add_argument(
        '--method',
        choices=CALIBRATION_METHODS,
        default='minmax',
        help='calibration method (activation ranges)',
    )
    parser.add_argument('--activation-type', choices=('uint8', 'int8'), default='uint8')
    parser.add_argument(
        '--per-tensor',
        action='store_true',
        help='one weight scale per tensor (default: per output channel)',
    )
    parser.add_argument(
        '--reduce-range',
        choices=('auto', 'on', 'off'),
        default='auto',
        help='7-bit weights; auto: on x86 CPUs without VNNI, where '
        "onnxruntime's U8S8 kernels saturate with 8-bit weights",
    )
    parser.add_argument('--symmetric-activations', action='store_true')
    parser.add_argument(
        '--exclude-ops',
        nargs='+',
        default=[],
        metavar='OP',
        help='ONNX op types left in float (e.g. Softmax Add)',
    )


def add_measurement_arguments(parser) -> None:
    """What is measured and written."""
    parser.add_argument(
        '--sqnr-images',
        type=int,
        default=16,
        metavar='N',
        help='test images the SQNR is measured on',
    )
    parser.add_argument('--no-metric', action='store_true', help='skip the test-set metric')
    parser.add_argument('--repeat', type=int, default=100, help='timed rounds (0: no timing)')
    parser.add_argument('--warmup', type=int, default=10)
    parser.add_argument(
        '--report',
        action='store_true',
        help="every form's SQNR; weight and activation ranges per module",
    )
    parser.add_argument(
        '--out',
        help='INT8 ONNX file, or IR .xml for openvino (default: <config>_<part>_<form>_int8.onnx '
        'or .xml)',
    )
    parser.add_argument('--force', action='store_true', help='replace --out if it exists')
    parser.add_argument('--dump', metavar='FILE.json', help='write all results as JSON')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)


def is_single_stage_detector(model) -> bool:
    return hasattr(model, 'bbox_head') and not hasattr(model, 'roi_head')


def build_form(model, form: str):
    model = copy.deepcopy(model)
    if form == 'folded':
        return mmrepa.reparameterize(model)
    return fold_identity_apart(model) if form == 'identity-apart' else model


def export(
    model, full: bool, x: torch.Tensor, path: str, what: str, backend: str = 'onnxruntime'
) -> float:
    """Export the backbone (``full``: the tensor forward) to ``path`` and check it in
    ``backend`` against PyTorch on ``x``; returns the largest absolute difference."""
    # eval(): a wrapper in training mode would put the model in training mode for the export
    # (export_onnx gives the wrapper's mode to the model), and BatchNorm would update
    module = TensorForward(model).eval() if full else model.backbone
    try:
        with torch.no_grad():  # unfolded layers use autograd functions the tracer cannot take
            export_onnx(module, x, path)
    except Exception as e:  # noqa: BLE001
        if not full:
            raise
        reason = (str(e).strip().splitlines() or [''])[0]
        sys.exit(
            f"{TOOL}: {type(model).__name__}'s tensor forward does not export with "
            f'torch.onnx ({type(e).__name__}: {reason[:200]}); quantize the backbone '
            '(drop --full)'
        )
    with torch.no_grad():
        scale = max(float(t.abs().max()) for t in flatten_outputs(module(x)))
    err = onnx_max_abs_error(module, x, open_session(path, backend))
    if not err <= 1e-3 * max(1.0, scale):
        raise RuntimeError(
            f'the float32 ONNX graph of the {what} model differs from PyTorch by '
            f'{err:.3g} (outputs up to {scale:.3g}): the export is wrong, '
            'quantizing it would measure nothing'
        )
    return err


def export_input(calib, shape) -> torch.Tensor:
    """The input the graph is traced and checked on: of ``shape`` (the exported input), a
    real image (the first calibration image, which ``check_inputs_shape`` found of that
    shape), so that the float32 check sees the activations the model sees."""
    x = torch.from_numpy(calib[0][0])
    if tuple(x.shape) != tuple(shape):  # a bug: main checks the calibration images first
        raise AssertionError(f'calibration image of shape {tuple(x.shape)}, export for {shape}')
    return x


def all_outputs(session, inputs):
    return [o for array, _ in inputs for o in session.run(None, {'input': array})]


def main_metric(metrics: dict) -> str:
    for key in ('coco/bbox_mAP', 'accuracy/top1', 'mIoU'):
        if key in metrics:
            return key
    return next(iter(metrics))


def print_report(report, forms, limit: int = 12) -> None:
    short = {'unfolded': 'unfold', 'folded': 'folded', 'identity-apart': 'id-apart'}
    cols = ' '.join(f'{short[f]:>8s}' for f in forms)
    print(f'  {"module (* changed by folding)":40s} max|w|: {cols}   max|act|: {cols}')
    for r in report[:limit]:
        w = ' '.join(f'{r[f]["weight_absmax"]:8.3g}' for f in forms)
        a = ' '.join(f'{r[f]["act_absmax"]:8.3g}' for f in forms)
        print(
            f'  {("* " if r["changed"] else "  ") + r["module"]:40.40s}         {w}             {a}'
        )
    if len(report) > limit:
        print(f'  ... {len(report) - limit} more (all in --dump)')


def accuracy_control(model, cfg, args, threads: int):
    """NNCF's accuracy-control arguments (see :func:`mmrepa.integrations.openvino.quantize_nncf`):
    the test loader's batches, their network inputs, and the test metric of a compiled model
    computing the backbone (``--full``: the tensor forward)."""
    key = []

    def to_input(batch):
        with torch.no_grad():
            return model.data_preprocessor(batch, False)['inputs'].float().numpy()

    def metric(compiled, batches):
        session = SessionModel(model, OpenVINOSession(compiled, threads), args.full)
        metrics = config_metric(session, cfg, batches)
        key[:] = key or [main_metric(metrics)]
        return metrics[key[0]], None

    return list(metric_loader(cfg)), to_input, metric, args.max_drop


@dataclass
class Job:
    """What the steps of :func:`main` share: the arguments, the file to write and, as the steps
    find them, the config, the model and the images."""

    args: argparse.Namespace
    out: str
    ext: str
    part: str
    cfg: Any = None
    model: Any = None
    folded_modules: List[str] = field(default_factory=list)
    calib: list = field(default_factory=list)
    tests: list = field(default_factory=list)
    shape: Tuple[int, ...] = ()
    threads: int = 1

    @property
    def openvino(self) -> bool:
        return self.args.backend == 'openvino'


def plan(args) -> Job:
    """The file to write, and the refusals that need nothing but the arguments."""
    part = 'full' if args.full else 'backbone'
    name = osp.splitext(osp.basename(args.config))[0]
    ext = BACKENDS[args.backend][1]
    out = args.out or f'{name}_{part}_{args.form}_int8{ext}'
    openvino = args.backend == 'openvino'
    if openvino and not out.endswith('.xml'):
        raise ConfigError(
            f'--out {out}: OpenVINO writes IR, name it .xml (the .bin goes beside it)'
        )
    if args.max_drop is not None and (not openvino or args.no_metric):
        raise ConfigError(
            "--max-drop is NNCF's accuracy control on the test metric: it needs --backend "
            'openvino and the metric (drop --no-metric)'
        )
    return Job(args, out, ext, part)


def check_files(job: Job):
    """Outputs that are no input and may be written, the backend installed, the config's
    inputs there; returns the config."""
    args = job.args
    # --force: --out (and its .bin); --dump is replaced
    outputs = [('--out', job.out)]
    if job.openvino:
        outputs.append(('--out (its .bin)', osp.splitext(job.out)[0] + '.bin'))
    outputs.append(('--dump', args.dump))
    check_outputs(TOOL, outputs, [('config', args.config), ('checkpoint', args.checkpoint)])
    check_outputs(TOOL, outputs[:-1], [], force=args.force)
    require(*BACKENDS[args.backend][0], tool=TOOL)
    cfg = load_config(args.config, args.cfg_options)
    splits = ('test',) if args.calib_split == 'test' else ('train', 'test')
    check_outputs(TOOL, outputs, config_inputs(cfg, splits))
    check_inputs(
        cfg,
        TOOL,
        splits=splits,
        checkpoints=[('checkpoint to quantize', 'CHECKPOINT argument', args.checkpoint)],
    )
    return cfg


def load_model(job: Job) -> None:
    """The model from the checkpoint, and the names of its foldable modules in the part."""
    model = init_model(job.cfg, job.args.checkpoint)
    if job.args.full and not is_single_stage_detector(model):
        raise ConfigError(
            f"--full quantizes a single-stage detector's tensor forward "
            f'(RetinaNet-style bbox_head); {type(model).__name__} is not one: '
            'drop --full to quantize its backbone'
        )
    scope = model if job.args.full else model.backbone
    job.model = model
    job.folded_modules = [n for n, m in scope.named_modules() if n and is_foldable(m)]


def read_images(job: Job) -> None:
    """Calibration and test images, all of the exported input's shape: checked before anything
    is exported or written."""
    args, cfg, preprocessor = job.args, job.cfg, job.model.data_preprocessor
    job.calib = pipeline_inputs(cfg, preprocessor, args.calib_images, args.calib_split)
    job.tests = pipeline_inputs(cfg, preprocessor, args.sqnr_images, 'test', seed=1)
    # the graph is exported for --shape, else for the pipeline's shape
    job.shape = (1, 3, *args.shape) if args.shape else tuple(job.calib[0][0].shape)
    check_inputs_shape(job.calib, job.shape, f'{args.calib_split} calibration image')
    check_inputs_shape(job.tests, job.shape, 'test image')


def quantization_options(job: Job) -> dict:
    """onnxruntime's options, or NNCF's (the onnxruntime ones do not apply to it)."""
    args = job.args
    if job.openvino:
        return dict(tool='nncf', accuracy_control=args.max_drop is not None, max_drop=args.max_drop)
    return dict(
        per_channel=not args.per_tensor,
        activation_type=args.activation_type,
        reduce_range=(
            needs_reduce_range() if args.reduce_range == 'auto' else args.reduce_range == 'on'
        ),
        method=args.method,
        symmetric_activations=args.symmetric_activations,
        exclude_op_types=list(args.exclude_ops),
    )


def describe(job: Job, options: dict) -> dict:
    """The result's first entries: what is quantized, how, on what."""
    args = job.args
    return dict(
        config=args.config,
        checkpoint=args.checkpoint,
        backend=args.backend,
        part=job.part,
        form=args.form,
        input_shape=list(job.shape),
        out=job.out,
        calibration_images=len(job.calib),
        calibration_split=args.calib_split,
        sqnr_images=len(job.tests),
        threads=job.threads,
        options=options,
        machine=machine_info(),
    )


def quantize_form(job: Job, form: str, x: torch.Tensor, tmp: str, options: dict):
    """Export ``form`` to float32 ONNX in ``tmp`` and quantize it (to --out for --form);
    returns (the model, float path, INT8 path, export error, calibration ranges or None)."""
    args = job.args
    target = build_form(job.model, form)
    float_path = osp.join(tmp, f'{form}.onnx')
    int8_path = job.out if form == args.form else osp.join(tmp, f'{form}_int8{job.ext}')
    export_error = export(target, args.full, x, float_path, form, args.backend)
    if not job.openvino:
        ranges = quantize_qdq(float_path, int8_path, job.calib, **options)
        return target, float_path, int8_path, export_error, ranges
    validation = None
    if args.max_drop is not None and form == args.form:
        validation = accuracy_control(target, job.cfg, args, job.threads)
    save_ir(quantize_nncf(read_model(float_path), job.calib, validation=validation), int8_path)
    # NNCF keeps its ranges in the FakeQuantize nodes
    return target, float_path, int8_path, export_error, None


def quantize_forms(job: Job, x: torch.Tensor, tmp: str, options: dict, result: dict):
    """--form first, then (--report) the other forms; returns ({form: (float path, INT8
    path)}, {form: weighted layers} with --report, {form: model})."""
    args = job.args
    forms = FORMS if args.report else (args.form,)
    paths, layers, targets = {}, {}, {}
    for form in (args.form,) + tuple(f for f in forms if f != args.form):
        with step(TOOL, f'exporting and quantizing the {form} {job.part}'):
            targets[form], *two_paths, export_error, ranges = quantize_form(
                job, form, x, tmp, options
            )
        paths[form] = tuple(two_paths)
        result.setdefault('export_max_abs_error', {})[form] = export_error
        if args.report:
            layers[form] = weighted_layers(two_paths[0], ranges)
        if form == args.form:
            print(
                f'wrote the INT8 {form} {job.part} ({args.method} calibration on '
                f'{len(job.calib)} {args.calib_split} images, input {job.shape}) to {job.out}',
                flush=True,
            )
    return paths, layers, targets


def compare_outputs(job: Job, paths: dict, result: dict) -> dict:
    """The INT8 file's quantized operations, and its SQNR against float32 on the test images;
    returns the two sessions of --form."""
    if job.openvino:
        ops = op_counts(job.out)
        result['int8_ops'] = dict(fake_quantize=ops.get('FakeQuantize', 0))
    else:
        result['qdq'] = qdq_summary(job.out)
    sessions = {
        k: open_session(p, job.args.backend, job.threads)
        for k, p in zip(('float32', 'int8'), paths[job.args.form])
    }
    ref, q = (all_outputs(sessions[k], job.tests) for k in ('float32', 'int8'))
    result['sqnr_db'] = sqnr_db(ref, q)
    n_out = len(ref) // len(job.tests)
    result['sqnr_db_per_output'] = [sqnr_db(ref[i::n_out], q[i::n_out]) for i in range(n_out)]
    print(
        f'SQNR of INT8 against float32 on {len(job.tests)} test images: '
        f'{result["sqnr_db"]:.1f} dB (per output: '
        f'{", ".join(f"{s:.1f}" for s in result["sqnr_db_per_output"])})',
        flush=True,
    )
    return sessions


def measure_metric(job: Job, target, sessions: dict, result: dict) -> None:
    """The config's test metric with the float32 and the INT8 graph."""
    with step(TOOL, 'testing the float32 and INT8 models on the test set'):
        result['metric'] = {
            k: config_metric(SessionModel(target, s, job.args.full), job.cfg)
            for k, s in sessions.items()
        }
    key = main_metric(result['metric']['float32'])
    f32, i8 = result['metric']['float32'][key], result['metric']['int8'][key]
    result.update(metric_key=key, metric_drop=f32 - i8)
    print(f'{key}: float32 {f32:.4g}, INT8 {i8:.4g} (drop {f32 - i8:.4g})', flush=True)


def time_sessions(job: Job, sessions: dict, result: dict) -> None:
    """float32 and INT8 latency in the backend, timed interleaved."""
    args, array = job.args, job.tests[0][0]
    stats = time_interleaved(
        {k: (lambda s=s: s.run(None, {'input': array})) for k, s in sessions.items()},
        repeat=args.repeat,
        warmup=args.warmup,
    )
    result['latency_ms'] = {
        k: dict(median=v.median, min=v.min, max=v.max) for k, v in stats.items()
    }
    result['speedup'] = stats['float32'].median / stats['int8'].median
    print(
        f'{args.backend} latency ({job.threads} thread(s), median of {args.repeat}): '
        f'float32 {stats["float32"].median:.2f} ms, INT8 '
        f'{stats["int8"].median:.2f} ms, speed-up {result["speedup"]:.2f}x',
        flush=True,
    )


def report_forms(job: Job, paths: dict, layers: dict, result: dict) -> None:
    """--report: every form's SQNR, and the ranges per module in each form."""
    result['forms'] = {}
    for form, (float_path, int8_path) in paths.items():
        f_out = all_outputs(open_session(float_path, job.args.backend, job.threads), job.tests)
        q_out = all_outputs(open_session(int8_path, job.args.backend, job.threads), job.tests)
        result['forms'][form] = dict(sqnr_db=sqnr_db(f_out, q_out))
    result['layers'] = layers
    result['fold_ranges'] = fold_range_report(layers, job.folded_modules)
    print(
        'SQNR by form: ' + ', '.join(f'{f} {result["forms"][f]["sqnr_db"]:.1f} dB' for f in FORMS)
    )
    print('ranges per module, unfolded / folded / identity-apart (widest fold first):')
    print_report(result['fold_ranges'], FORMS)


@one_line_errors(TOOL)
def main(argv=None) -> dict:
    """Returns the results (as --dump writes them)."""
    args = parse_args(argv)
    job = plan(args)
    job.cfg = check_files(job)
    load_model(job)
    read_images(job)
    options = quantization_options(job)
    job.threads = torch.get_num_threads()
    result = describe(job, options)
    x = export_input(job.calib, job.shape)
    with tempfile.TemporaryDirectory(prefix='mmrepa.quantize.') as tmp:
        paths, layers, targets = quantize_forms(job, x, tmp, options, result)
        sessions = compare_outputs(job, paths, result)
        if not args.no_metric:
            measure_metric(job, targets[args.form], sessions, result)
        if args.repeat > 0:
            time_sessions(job, sessions, result)
        if args.report:
            report_forms(job, paths, layers, result)
    finish(result['machine'])
    if args.dump:
        write_json(result, args.dump)
    return result


if __name__ == '__main__':
    main()
