"""OpenVINO (``openvino``) and NNCF post-training INT8 (``nncf``), both optional.

- :func:`convert_onnx`: an ONNX file to OpenVINO IR (``.xml`` + ``.bin``, float32 weights: IR's
  default of float16 weights would change the outputs), written atomically, both files or none;
- :func:`compile_model`: a CPU compiled model in float32 (no bf16 / f16 execution hint, which
  the CPU plug-in picks on CPUs that have them) with a given number of threads;
- :class:`OpenVINOSession`: a compiled model behind onnxruntime's session interface
  (``get_inputs()[0].shape``, ``run(None, {'input': array})``), so that what measures,
  times and evaluates an onnxruntime session takes OpenVINO's too;
- :func:`quantize_nncf`: NNCF post-training INT8 of an IR, calibrated on inputs of the graph's
  shape (else :class:`~mmrepa.integrations.quantize.CalibrationMismatch`), or with NNCF's
  accuracy control when a largest metric drop is given.
"""

import contextlib
import ctypes
import os
import os.path as osp
import shutil
import sys
import tempfile
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..utils.files import set_user_mode
from .optional import imported
from .quantize import check_inputs_shape


def _ov():
    return imported('openvino', __name__)


class _SignalStack(ctypes.Structure):
    _fields_ = [
        ('ss_sp', ctypes.c_void_p),
        ('ss_flags', ctypes.c_int),
        ('ss_size', ctypes.c_size_t),
    ]


@contextlib.contextmanager
def signal_stack_kept():
    """Inside, OpenVINO may be loaded and compile; after, the thread's alternate signal stack
    is the one it had before.

    Each ``openvino.Core``'s CPU plug-in (2026.4) sets the thread it is loaded on to a signal
    stack of its own and, when unloaded, sets the one it found back, freeing its own. Two
    plug-ins unloaded in the order they were loaded leave the thread on freed memory, and the
    next signal Python handles there (Ctrl-C, a child's exit once torch's DataLoader has set
    its SIGCHLD handler) ends the process with SIGSEGV. With the stack put back here, a
    plug-in never finds its own current when unloaded: it only frees it."""
    libc = ctypes.CDLL(None) if sys.platform != 'win32' else None
    if libc is None or not hasattr(libc, 'sigaltstack'):
        yield
        return
    before = _SignalStack()
    libc.sigaltstack(None, ctypes.byref(before))
    try:
        yield
    finally:
        libc.sigaltstack(ctypes.byref(before), None)


def save_ir(model, xml_path: str) -> None:
    """Save an ``openvino.Model`` to ``xml_path`` and the ``.bin`` beside it, float32 weights,
    both files in place or neither (written in a temporary folder, then moved: the ``.bin``
    first, so that an ``.xml`` never names a missing or older one)."""
    ov = _ov()
    xml_path = osp.abspath(xml_path)
    folder = osp.dirname(xml_path)
    os.makedirs(folder, exist_ok=True)
    base = osp.splitext(osp.basename(xml_path))[0]
    tmp = tempfile.mkdtemp(dir=folder, prefix=f'.{base}.', suffix='.tmp')
    try:
        ov.save_model(model, osp.join(tmp, f'{base}.xml'), compress_to_fp16=False)
        for ext in ('.bin', '.xml'):
            set_user_mode(osp.join(tmp, base + ext))
            os.replace(osp.join(tmp, base + ext), osp.join(folder, base + ext))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_onnx(onnx_path: str, xml_path: str) -> None:
    """Convert the ONNX file to OpenVINO IR at ``xml_path`` (see :func:`save_ir`)."""
    save_ir(_ov().convert_model(onnx_path), xml_path)


def read_model(path: str):
    return _ov().Core().read_model(path)


def compile_model(model, threads: int = 0):
    """``model`` (an ``openvino.Model`` or an IR / ONNX path) compiled for the CPU in float32,
    ``threads`` inference threads (0: OpenVINO's default), latency mode (one stream)."""
    ov = _ov()
    config = {'INFERENCE_PRECISION_HINT': 'f32', 'PERFORMANCE_HINT': 'LATENCY'}
    if threads:
        config['INFERENCE_NUM_THREADS'] = threads
    with signal_stack_kept():
        return ov.Core().compile_model(model, 'CPU', config)


class _Input:
    def __init__(self, shape):
        self.shape = shape


class OpenVINOSession:
    """A compiled OpenVINO model with onnxruntime's session interface for one-input graphs:
    ``get_inputs()[0].shape`` (static dims as ints) and ``run(None, {name: array})`` -> the
    outputs as numpy arrays, in the graph's order. One infer request, reused (what latency
    timing should measure)."""

    def __init__(self, model, threads: int = 0):
        ov = _ov()
        # a compiled model (NNCF's accuracy control hands them to the metric) is used as it is
        self.compiled = (
            model if isinstance(model, ov.CompiledModel) else compile_model(model, threads)
        )
        self.request = self.compiled.create_infer_request()
        shape = self.compiled.inputs[0].get_partial_shape()
        self.shape = [d.get_length() if d.is_static else None for d in shape]

    def get_inputs(self) -> List[_Input]:
        return [_Input(self.shape)]

    def run(self, output_names, feed: dict) -> List[np.ndarray]:
        (array,) = feed.values()
        self.request.infer([np.ascontiguousarray(array, dtype=np.float32)])
        return [
            self.request.get_output_tensor(i).data.copy() for i in range(len(self.compiled.outputs))
        ]


def quantize_nncf(
    model,
    inputs: Sequence[Tuple[np.ndarray, str]],
    *,
    validation: Optional[Tuple[Iterable, Callable, Callable, float]] = None,
    fast_bias_correction: bool = True,
):
    """NNCF post-training INT8 of ``model`` (an ``openvino.Model``), calibrated on ``inputs``
    (``[(array, source), ...]``, see :func:`~mmrepa.integrations.quantize.pipeline_inputs`),
    which must all have the graph's input shape (checked first). Symmetric INT8 weights per
    output channel and activations as NNCF's CPU defaults place them (FakeQuantize nodes the CPU
    plug-in runs as INT8 kernels); graphs with attention in NNCF's transformer mode.

    ``validation``: ``(items, to_input, metric_fn, max_drop)`` runs NNCF's accuracy control
    instead: the quantized model's ``metric_fn(compiled_model, items)`` -> ``(metric, None)``
    (higher is better; also called on subsets and single items) may lose at most ``max_drop``
    (absolute) against float32's; NNCF returns layers to float, those that cost most first,
    until it does. ``to_input(item)`` is an item's network input. Returns the quantized
    ``openvino.Model``.
    """
    nncf = imported('nncf', __name__)
    shape = tuple(d.get_length() for d in model.inputs[0].get_partial_shape())
    check_inputs_shape(inputs, shape)
    arrays = [np.ascontiguousarray(a, dtype=np.float32) for a, _ in inputs]
    calibration = nncf.Dataset(arrays)
    # attention graphs (a Softmax) as transformers: NNCF's default (CNN) quantizer propagation
    # stops with a KeyError at the window attention's index Gathers (nncf 3.4.0), and its
    # transformer mode keeps the attention's own ops where its CPU kernels want them
    transformer = any(op.get_type_name() == 'Softmax' for op in model.get_ops())
    options = dict(
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
        subset_size=len(arrays),
        fast_bias_correction=fast_bias_correction,
        target_device=nncf.TargetDevice.CPU,
    )
    with signal_stack_kept():  # NNCF compiles models of its own
        if validation is None:
            return nncf.quantize(model, calibration, **options)
        items, to_input, metric_fn, max_drop = validation
        return nncf.quantize_with_accuracy_control(
            model,
            calibration,
            nncf.Dataset(list(items), to_input),
            metric_fn,
            max_drop=max_drop,
            drop_type=nncf.DropType.ABSOLUTE,
            **options,
        )


def op_counts(model) -> dict:
    """Op types of an ``openvino.Model`` (or IR path) and how many of each, most first
    (``FakeQuantize``: the INT8 points NNCF placed)."""
    import collections

    if isinstance(model, str):
        model = read_model(model)
    return dict(collections.Counter(op.get_type_name() for op in model.get_ops()).most_common())
