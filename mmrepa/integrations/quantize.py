"""Post-training static INT8 quantization with onnxruntime (QDQ), and what to measure about it.

- :func:`pipeline_inputs`: calibration (or evaluation) inputs, images of a config's data set
  through its test pipeline and the model's data preprocessor, exactly as the model sees them;
- :class:`CalibrationReader`: onnxruntime's calibration data reader over such inputs, refusing
  any whose shape is not the one the ONNX graph was exported for (:class:`CalibrationMismatch`);
- :func:`quantize_qdq`: ``quantize_static`` in QDQ format, per-channel weights, written
  atomically (a failure leaves no file), returning the calibrated activation ranges;
- :class:`SessionModel`: an mmdet / mmseg model whose backbone (or single-stage tensor forward)
  an onnxruntime or OpenVINO session computes, for the test metric and end-to-end timing;
- :func:`config_metric`: the config's test metric of such a model (or any with ``test_step``),
  as plain floats (:func:`plain_metrics`);
- :func:`sqnr_db`: signal-to-quantization-noise ratio of INT8 outputs against float32;
- :func:`weighted_layers` and :func:`fold_range_report`: per-layer weight ranges (from the ONNX
  initializers) and activation ranges (from the calibration), and how folding changed them;
- :func:`fold_identity_apart`: the fold with identity shortcuts kept out of the weights, which
  INT8 needs (RepVGG layers, channel-idle FFNs whose pre-norm folds).
"""

import contextlib
import copy
import io
import os.path as osp
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError, InputError
from ..fold import FoldPolicy, reparameterize
from ..utils.files import atomic_output
from .optional import imported

WEIGHTED_OPS = ('Conv', 'MatMul', 'Gemm')


class CalibrationMismatch(InputError):
    """Calibration (or test) data that the exported graph cannot take (the message says
    why)."""


def mismatch_message(
    index: int,
    source: str,
    got: Tuple[int, ...],
    expected: Tuple[int, ...],
    what: str = 'calibration batch',
) -> str:
    """Why input ``index`` (``source``: its image) of shape ``got`` does not fit a graph
    exported for ``expected``; ``what`` names the set it is from ('calibration batch',
    'test image', ...)."""
    return (
        f'{what} {index} ({source}) has shape {tuple(got)} but the model was exported '
        f'for input {tuple(expected)}: the ONNX graph is traced for one input shape (window '
        f'layouts, masks and paddings are constants), so every {what} must have it. Export '
        'for the shape the test pipeline gives (tools/quantize.py: drop --shape), or make '
        'the pipeline give one shape (a fixed Resize without keep_ratio, or a Pad to a '
        'fixed size)'
    )


def _build_dataset(cfg, split: str):
    """The config's ``split`` data set with the test pipeline (the train split's images are
    read as test images: no augmentation)."""
    import copy
    import importlib

    loader = cfg.get(f'{split}_dataloader')
    if not loader or not isinstance(loader.get('dataset'), dict):
        raise ConfigError(
            f'the config has no {split}_dataloader.dataset to calibrate on; '
            'use the other split (--calib-split)'
        )
    dataset = copy.deepcopy(loader.dataset)
    if 'pipeline' not in dataset:
        raise ConfigError(
            f'{split}_dataloader.dataset ({dataset.get("type")}) wraps other data '
            'sets; calibrate on the test split (--calib-split test)'
        )
    dataset['pipeline'] = copy.deepcopy(cfg.test_dataloader.dataset.pipeline)
    if split == 'train':
        dataset['test_mode'] = False
    registry = importlib.import_module(f'{cfg.get("default_scope", "mmengine")}.registry')
    return registry.DATASETS.build(dataset)


def pipeline_inputs(
    cfg, data_preprocessor, num: int, split: str = 'train', seed: int = 0
) -> List[Tuple[np.ndarray, str]]:
    """``num`` images of the config's ``split`` data set (a fixed-seed random choice; all if
    fewer) through the config's test pipeline and ``data_preprocessor`` (the model's, in
    inference mode), one per batch: ``[(array (1, 3, H, W) float32, image path), ...]``."""
    from mmengine.dataset import pseudo_collate

    dataset = _build_dataset(cfg, split)
    order = np.random.default_rng(seed).permutation(len(dataset))[:num]
    inputs = []
    with torch.no_grad():
        for i in order:
            item = dataset[int(i)]
            data = data_preprocessor(pseudo_collate([item]), False)
            sample = item.get('data_samples')
            path = getattr(sample, 'img_path', None) or f'{split} image {int(i)}'
            inputs.append((data['inputs'].float().cpu().numpy(), str(path)))
    return inputs


def check_inputs_shape(
    inputs: Iterable[Tuple[np.ndarray, str]],
    expected: Sequence[int],
    what: str = 'calibration batch',
) -> None:
    """Raise :class:`CalibrationMismatch` at the first input not of shape ``expected``;
    ``what`` names the inputs in the message ('calibration image', 'test image', ...)."""
    for i, (array, source) in enumerate(inputs):
        if tuple(array.shape) != tuple(expected):
            raise CalibrationMismatch(mismatch_message(i, source, array.shape, expected, what))


def run_session(session, x: torch.Tensor, what: str) -> List[torch.Tensor]:
    """The session's outputs on ``x`` (onnxruntime's session interface), refusing an input of
    another shape than the graph's (:class:`CalibrationMismatch`)."""
    expected = tuple(session.get_inputs()[0].shape)
    if tuple(x.shape) != expected:
        raise CalibrationMismatch(
            f'{what} has shape {tuple(x.shape)} after the test pipeline but the graph was '
            f'exported for {expected}: the test pipeline must give one shape'
        )
    return [torch.from_numpy(o) for o in session.run(None, {'input': x.float().numpy()})]


class SessionBackbone(torch.nn.Module):
    """A session in a backbone's place: its feature maps as a tuple."""

    def __init__(self, session):
        super().__init__()
        self.session = session

    def forward(self, x):
        return tuple(run_session(self.session, x, 'a test image'))


class SessionModel(torch.nn.Module):
    """``model`` (an mmdet / mmseg model) with ``session`` (an onnxruntime session or
    :class:`~mmrepa.integrations.openvino.OpenVINOSession`) computing its backbone, or with
    ``full`` a single-stage detector's tensor forward (RetinaNet-style heads: the session
    returns each level's class scores, then each level's box deltas); the data preprocessor,
    the rest of the model and the post-processing stay in PyTorch. Duck-types the model for
    ``test_step`` and ``cfg``, so the test loop, mmdet's ``inference_detector`` and mmseg's
    ``inference_model`` take it. The model's weights are shared, not copied."""

    def __init__(self, model: torch.nn.Module, session, full: bool = False):
        super().__init__()
        self.full, self.session = full, session
        self.cfg = getattr(model, 'cfg', None)
        self.model = copy.copy(model)  # shallow: its own module slots, the same weights
        if not full:
            self.model._modules = dict(model._modules, backbone=SessionBackbone(session))
        self.data_preprocessor = model.data_preprocessor

    def test_step(self, batch: dict) -> list:
        data = self.data_preprocessor(batch, False)
        with torch.no_grad():
            if not self.full:
                return self.model(**data, mode='predict')
            outs = run_session(self.session, data['inputs'], 'a test image')
            n = len(outs) // 2
            results = self.model.bbox_head.predict_by_feat(
                outs[:n],
                outs[n:],
                batch_img_metas=[s.metainfo for s in data['data_samples']],
                rescale=True,
            )
            return self.model.add_pred_to_datasample(data['data_samples'], results)


def metric_loader(cfg):
    """The config's test loader, batch 1, in this process."""
    from mmengine.runner import Runner

    loader_cfg = copy.deepcopy(cfg.test_dataloader)
    loader_cfg.update(batch_size=1, num_workers=0, persistent_workers=False)
    return Runner.build_dataloader(loader_cfg)


def plain_metrics(metrics: dict) -> dict:
    """An evaluator's metrics as JSON takes them: floats, and lists of floats for per-class
    values (mmpretrain's SingleLabelMetric with ``average=None`` gives arrays)."""
    return {
        k: [float(x) for x in v]
        if isinstance(v, (list, tuple)) or getattr(v, 'ndim', 0)
        else float(v)
        for k, v in metrics.items()
    }


def config_metric(model, cfg, batches: Optional[list] = None) -> dict:
    """The config's test metric of ``model`` (anything with ``test_step``: a model, a
    :class:`SessionModel`, mmdeploy's backend model), batch 1, on ``batches`` of
    :func:`metric_loader` if given, else on the whole test set; :func:`plain_metrics`."""
    from mmengine.evaluator import Evaluator

    loader = metric_loader(cfg)
    batches = loader if batches is None else list(batches)
    evaluator = Evaluator(copy.deepcopy(cfg.test_evaluator))
    evaluator.dataset_meta = loader.dataset.metainfo
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # pycocotools' prints
        for batch in batches:
            evaluator.process(data_samples=model.test_step(batch), data_batch=batch)
        metrics = evaluator.evaluate(len(batches) if batches is not loader else len(loader.dataset))
    return plain_metrics(metrics)


try:  # onnxruntime is optional (mmrepa.integrations.optional): the module imports without it, for
    # the tools' --help and constants; nothing that quantizes runs without it
    from onnxruntime.quantization import CalibrationDataReader as _ReaderBase
except ImportError:
    _ReaderBase = object


class CalibrationReader(_ReaderBase):
    """onnxruntime's calibration reader over ``[(array, source), ...]`` for the graph input
    ``input_name`` of shape ``expected``; an input of another shape raises
    :class:`CalibrationMismatch` (also when onnxruntime reads it)."""

    def __init__(
        self,
        inputs: Sequence[Tuple[np.ndarray, str]],
        expected: Sequence[int],
        input_name: str = 'input',
    ):
        self.inputs, self.expected, self.input_name = list(inputs), tuple(expected), input_name
        self.index = 0

    def __len__(self) -> int:
        return len(self.inputs)

    def get_next(self) -> Optional[Dict[str, np.ndarray]]:
        if self.index >= len(self.inputs):
            return None
        array, source = self.inputs[self.index]
        if tuple(array.shape) != self.expected:
            raise CalibrationMismatch(
                mismatch_message(self.index, source, array.shape, self.expected)
            )
        self.index += 1
        return {self.input_name: np.ascontiguousarray(array, dtype=np.float32)}

    def rewind(self) -> None:
        self.index = 0


def input_shape(path: str) -> Tuple[int, ...]:
    """The (static) shape of the ONNX graph's first input."""
    onnx = imported('onnx', __name__)
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims)


CALIBRATION_METHODS = ('minmax', 'entropy', 'percentile')


def quantize_qdq(
    float_path: str,
    out_path: str,
    inputs: Sequence[Tuple[np.ndarray, str]],
    *,
    per_channel: bool = True,
    activation_type: str = 'uint8',
    reduce_range: bool = False,
    method: str = 'minmax',
    symmetric_activations: bool = False,
    exclude_op_types: Sequence[str] = (),
    exclude_nodes: Sequence[str] = (),
) -> Dict[str, Tuple[float, float]]:
    """Quantize the float ONNX model ``float_path`` to INT8 QDQ at ``out_path``; returns the
    calibrated activation ranges (tensor name -> (min, max)).

    Weights are signed INT8 (symmetric), per output channel unless ``per_channel=False``;
    activations ``activation_type`` ('uint8': U8S8, what onnxruntime's x86 kernels are made
    for; 'int8': S8S8), calibrated on ``inputs`` (see :func:`pipeline_inputs`) by ``method``.
    ``reduce_range`` uses 7-bit weights (avoids the saturation of AVX2's ``vpmaddubsw`` on CPUs
    without VNNI). Nodes of ``exclude_op_types`` and the nodes named in ``exclude_nodes`` keep
    float inputs. The inputs are checked against the graph's input shape first
    (:class:`CalibrationMismatch`); the file appears complete or not at all.
    """
    ortq = imported('onnxruntime.quantization', __name__)
    QuantType = ortq.QuantType
    calibrate = imported('onnxruntime.quantization.calibrate', __name__)
    if method not in CALIBRATION_METHODS:
        raise InputError(f'method must be one of {CALIBRATION_METHODS}, got {method!r}')
    expected = input_shape(float_path)
    check_inputs_shape(inputs, expected)
    exclude = list(exclude_nodes)
    if exclude_op_types:
        onnx = imported('onnx', __name__)
        graph = onnx.load(float_path, load_external_data=False).graph
        exclude += [n.name for n in graph.node if n.op_type in exclude_op_types]
    with (
        atomic_output(out_path, suffix='.onnx.tmp') as tmp,
        tempfile.TemporaryDirectory(prefix='mmrepa.calib.') as calib_dir,
    ):
        cache = osp.join(calib_dir, 'ranges.json')
        ortq.quantize_static(
            float_path,
            tmp,
            CalibrationReader(inputs, expected),
            quant_format=ortq.QuantFormat.QDQ,
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=QuantType.QUInt8 if activation_type == 'uint8' else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=exclude or None,
            calibrate_method=getattr(
                ortq.CalibrationMethod,
                {'minmax': 'MinMax', 'entropy': 'Entropy', 'percentile': 'Percentile'}[method],
            ),
            extra_options=dict(ActivationSymmetric=symmetric_activations, WeightSymmetric=True),
            calibration_cache_path=cache,
        )
        ranges = {
            name: tuple(float(v) for v in np.asarray(r.range_value).reshape(-1)[:2])
            for name, r in calibrate.load_tensors_data(cache).data.items()
        }
    return ranges


def sqnr_db(reference: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> float:
    """Signal-to-quantization-noise ratio in dB, ``10 log10(sum ref^2 / sum (ref - test)^2)``
    over all outputs together (inf if they are equal)."""
    signal = sum(float(np.square(r.astype(np.float64)).sum()) for r in reference)
    noise = sum(float(np.square(r.astype(np.float64) - t).sum()) for r, t in zip(reference, test))
    if noise == 0:
        return float('inf')
    return 10 * np.log10(signal / noise) if signal > 0 else float('-inf')


def qdq_summary(path: str) -> dict:
    """What a QDQ file holds: counts of QuantizeLinear / DequantizeLinear, of 8-bit weight
    dequantizations, and of those with one scale per output channel."""
    onnx = imported('onnx', __name__)
    numpy_helper = imported('onnx.numpy_helper', __name__)

    graph = onnx.load(path).graph
    inits = {i.name: i for i in graph.initializer}
    ops = [n.op_type for n in graph.node]
    weights = [
        n
        for n in graph.node
        if n.op_type == 'DequantizeLinear'
        and n.input[0] in inits
        and n.input[1] in inits
        and inits[n.input[0]].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
        and len(inits[n.input[0]].dims) >= 2
    ]
    per_channel = sum(numpy_helper.to_array(inits[n.input[1]]).size > 1 for n in weights)
    return dict(
        quantize_linear=ops.count('QuantizeLinear'),
        dequantize_linear=ops.count('DequantizeLinear'),
        int8_weights=len(weights),
        per_channel_weights=int(per_channel),
    )


def runtime_op_counts(path: str, threads: int = 1) -> Dict[str, int]:
    """Op types of the graph onnxruntime actually runs (after its fusions: QDQ groups become
    ``QLinearConv``, ``QLinearMatMul``, ``MatMulIntegerToFloat`` ... where a kernel exists)."""
    import collections

    onnx, ort = imported('onnx', __name__), imported('onnxruntime', __name__)

    with tempfile.TemporaryDirectory(prefix='mmrepa.ort.') as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.optimized_model_filepath = osp.join(tmp, 'optimized.onnx')
        ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
        graph = onnx.load(options.optimized_model_filepath).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def _layer_name(node_name: str, op_type: str) -> str:
    """'/module/stages.0/blocks.0/ffn/fc1/Gemm' -> 'stages.0.blocks.0.ffn.fc1' (the module
    scope the exporter writes into node names; wrappers' 'module' / 'model' dropped)."""
    parts = [p for p in node_name.split('/') if p]
    if parts and parts[-1].split('_')[0] == op_type:
        parts = parts[:-1]
    while parts and parts[0] in ('module', 'model'):
        parts = parts[1:]
    return '.'.join(parts) or node_name


def weighted_layers(
    path: str, activation_ranges: Optional[Dict[str, Tuple[float, float]]] = None
) -> List[dict]:
    """One row per Conv / MatMul / Gemm with a constant weight in the float ONNX file: its
    layer (module scope), op, weight min / max / max |w|, the spread of per-output-channel
    max |w| (largest / median: what per-tensor scales would lose) and, given the calibration's
    ``activation_ranges``, the (min, max) of its input and output."""
    onnx = imported('onnx', __name__)
    numpy_helper = imported('onnx.numpy_helper', __name__)

    graph = onnx.load(path).graph
    inits = {i.name: i for i in graph.initializer}
    # constants the exporter left as Constant nodes count as weights too
    for node in graph.node:
        if node.op_type == 'Constant' and node.attribute and node.attribute[0].name == 'value':
            inits.setdefault(node.output[0], node.attribute[0].t)
    ranges = activation_ranges or {}
    rows = []
    for node in graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        if w.ndim < 2:
            continue
        # output channels: axis 0 of Conv and of Gemm with transB, the last axis of MatMul
        trans_b = any(a.name == 'transB' and a.i for a in node.attribute)
        axis = 0 if node.op_type == 'Conv' or (node.op_type == 'Gemm' and trans_b) else -1
        per_channel = np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(1)
        median = float(np.median(per_channel))
        rows.append(
            dict(
                layer=_layer_name(node.name, node.op_type),
                op=node.op_type,
                weight_min=float(w.min()),
                weight_max=float(w.max()),
                weight_absmax=float(np.abs(w).max()),
                channel_spread=float(per_channel.max() / median) if median > 0 else float('inf'),
                input_range=ranges.get(node.input[0]),
                output_range=ranges.get(node.output[0]),
            )
        )
    return rows


def _absmax(r) -> float:
    return max(abs(r[0]), abs(r[1])) if r else float('nan')


def fold_range_report(
    layers: Dict[str, List[dict]], folded_modules: Sequence[str], reference: str = 'unfolded'
) -> List[dict]:
    """How each form of the model (``layers``: form name -> :func:`weighted_layers` rows, e.g.
    'unfolded', 'folded', 'identity-apart') changed the ranges INT8 must cover, per module.

    A layer belongs to the innermost of ``folded_modules`` (the foldable modules, named as in
    the graph) that contains it, else it is its own group; so a fold's layers are compared as
    a whole even when the fold renamed or merged them. Per group and form: its layers, max |w|,
    the largest per-channel spread and max |activation| (inputs and outputs of its layers), and
    their ratios to ``reference`` (> 1: the form widened the range); ``changed``: the layers or
    their weights differ between the forms. Changed groups first, widest weight ratio first.
    """
    scopes = sorted(folded_modules, key=lambda s: -s.count('.'))  # innermost first

    def group_of(layer: str) -> str:
        for scope in scopes:
            if layer == scope or layer.startswith(scope + '.'):
                return scope
        return layer

    groups: Dict[str, Dict[str, List[dict]]] = {}
    for form, rows in layers.items():
        for row in rows:
            groups.setdefault(group_of(row['layer']), {f: [] for f in layers})[form].append(row)
    report = []
    for name, by_form in groups.items():
        entry = dict(module=name)
        signatures = set()
        for form, rows in by_form.items():
            acts = [_absmax(r[k]) for r in rows for k in ('input_range', 'output_range') if r[k]]
            entry[form] = dict(
                layers=[r['layer'] for r in rows],
                weight_absmax=max((r['weight_absmax'] for r in rows), default=float('nan')),
                channel_spread=max((r['channel_spread'] for r in rows), default=float('nan')),
                act_absmax=max(acts, default=float('nan')),
            )
            signatures.add(tuple((r['layer'], round(r['weight_absmax'], 6)) for r in rows))
        entry['changed'] = len(signatures) > 1
        ref = entry.get(reference)
        for form in by_form:
            if ref is not None and form != reference:
                entry[form]['ratio'] = {
                    k: entry[form][k] / ref[k] if ref[k] and np.isfinite(ref[k]) else None
                    for k in ('weight_absmax', 'channel_spread', 'act_absmax')
                }
        report.append(entry)

    def widening(entry):
        ratios = [
            entry[f]['ratio']['weight_absmax'] or 0 for f in layers if 'ratio' in entry.get(f, {})
        ]
        return (not entry['changed'], -max(ratios, default=0))

    return sorted(report, key=widening)


def needs_reduce_range() -> bool:
    """True on x86 CPUs without VNNI: onnxruntime's U8S8 kernels there multiply with
    ``vpmaddubsw``, whose 16-bit sums of two u8 x s8 products saturate for full 8-bit weights;
    7-bit weights (``reduce_range``) cannot. On this repository's CPU (AVX2, no VNNI) they
    raised the demo RePa-Swin backbone's SQNR from 21.7 to 24.0 dB."""
    import platform

    from ..utils.machine import cpu_flags

    if platform.machine().lower() not in ('x86_64', 'amd64', 'i386', 'i686'):
        return False
    return not any('vnni' in flag for flag in cpu_flags())


# --- quantization-aware folding: identity shortcuts kept out of the weights -------------------


def fold_identity_apart(model: torch.nn.Module) -> torch.nn.Module:
    """Fold ``model`` as :func:`mmrepa.reparameterize` does, in place, but keep identity
    shortcuts out of the weights (``FoldPolicy(identity_apart=True)``): RepVGG layers compute
    ``act(conv(x) + x * s)`` (instead of ``s`` on the kernel's diagonal centre taps),
    channel-idle FFNs whose pre-norm folds add ``r * x`` after their folded matrices (instead of
    ``diag(r)`` in ``in_proj``). The function is the same up to float rounding, for one
    elementwise add per layer; the weights and ``in_proj``'s outputs keep the ranges of the
    trained branches, which 8-bit scales resolve far better than an identity (``~1`` or
    ``1/sigma``) next to weights of ``~0.1``. Other layers fold as usual. Returns the model.
    """
    return reparameterize(model, FoldPolicy(identity_apart=True))
