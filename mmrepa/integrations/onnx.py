"""ONNX export of a (folded) module for a fixed input shape, and onnxruntime sessions."""

import warnings
from typing import Iterator, List

import numpy as np
import torch
import torch.nn as nn

from ..errors import InputError
from .optional import imported


def flatten_outputs(out) -> Iterator[torch.Tensor]:
    """Tensors of a nested tuple/list output, in order; ``None`` entries are skipped (mmdet's
    heads return them for parts they do not compute)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif out is not None:
        for item in out:
            yield from flatten_outputs(item)


class FlatOutputs(nn.Module):
    """``module(x, **kwargs)`` with its nested outputs flattened to a tuple of tensors."""

    def __init__(self, module: nn.Module, **kwargs):
        super().__init__()
        self.module = module
        self.kwargs = kwargs

    def forward(self, x: torch.Tensor):
        return tuple(flatten_outputs(self.module(x, **self.kwargs)))


class TensorForward(nn.Module):
    """``model(inputs, mode='tensor')``: an mmdet / mmseg model's tensor forward as a module to
    export (a single-stage detector's head outputs), in the model's own mode."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.train(model.training)  # export_onnx sets the whole tree to the wrapper's mode

    def forward(self, x):
        return self.model(x, mode='tensor')


def export_onnx(module: nn.Module, x: torch.Tensor, path: str, opset: int = 17) -> None:
    """Export ``module`` (outputs: tensors, nested or not) on input ``x`` to ``path``.

    The graph is traced for ``x``'s shape: window layouts and masks become constants, so the
    file runs on that shape only. Input ``input``, outputs ``output0``, ``output1``, ...
    """
    # the exporter restores the wrapper's mode on exit, recursively: it must be the module's
    module = FlatOutputs(module).train(module.training)
    with torch.no_grad():
        n_out = len(module(x))
    with warnings.catch_warnings():
        # sizes turning into constants is intended: the graph is for one shape
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            (x,),
            path,
            input_names=['input'],
            output_names=[f'output{i}' for i in range(n_out)],
            opset_version=opset,
            dynamo=False,
        )


def onnxruntime_session(path: str, threads: int = 0):
    """A CPU onnxruntime session; ``threads`` intra-op threads (0: onnxruntime's default)."""
    ort = imported('onnxruntime', __name__)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def run_onnx(session, x: torch.Tensor) -> List[np.ndarray]:
    """The session's outputs on ``x``; an input of another size than the exported one is
    refused (the graph's window layouts and masks are constants for that size)."""
    exported = tuple(session.get_inputs()[0].shape)
    if all(isinstance(d, int) for d in exported) and exported != tuple(x.shape):
        raise InputError(
            f'the ONNX graph was exported for input {exported} but got '
            f'{tuple(x.shape)}: export it again for this size '
            '(tools/export_onnx.py --shape H W)'
        )
    return session.run(None, {'input': x.detach().cpu().numpy()})


def onnx_max_abs_error(module: nn.Module, x: torch.Tensor, session) -> float:
    """Largest absolute difference between the session's and ``module``'s outputs on ``x``."""
    with torch.no_grad():
        ref = [t.cpu().numpy() for t in flatten_outputs(module(x))]
    outs = run_onnx(session, x)
    if len(outs) != len(ref):
        raise RuntimeError(f'onnxruntime returned {len(outs)} outputs, PyTorch {len(ref)}')
    for o, r in zip(outs, ref):
        if o.shape != r.shape:
            raise RuntimeError(f'onnxruntime output of shape {o.shape}, PyTorch {r.shape}')
    return max(float(np.abs(o - r).max()) for o, r in zip(outs, ref))
