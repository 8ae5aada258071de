"""Parameters and multiply-accumulates with mmengine's analysis tools.

mmengine's ``FlopAnalyzer`` counts one fused multiply-add as one "flop", i.e. MACs. It has no
handle for ``scaled_dot_product_attention``, so attention would count as free; we add one.
"""

from typing import Any, List

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import get_shape


def sdpa_macs(inputs: List[Any], outputs: List[Any]) -> int:
    """MACs of ``softmax(Q K^T) V``: Q (..., L, E), K (..., S, E), V (..., S, Ev)."""
    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = 1
    for d in q[:-2]:
        batch *= d
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def complexity(model: nn.Module, inputs) -> dict:
    """``dict(params=..., macs=...)`` of ``model(*inputs)`` (MACs of one forward)."""
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_macs)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return dict(params=parameter_count(model)[''], macs=analyzer.total())


class _TensorForward(nn.Module):
    """``model(inputs, data_samples, mode='tensor')`` as a one-argument module, for tracing."""

    def __init__(self, model: nn.Module, data_samples):
        super().__init__()
        self.model, self.data_samples = model, data_samples

    def forward(self, inputs: torch.Tensor):
        return self.model(inputs, self.data_samples, mode='tensor')


def model_complexity(model: nn.Module, data: dict) -> dict:
    """:func:`complexity` of a detector's or segmentor's tensor forward on ``data`` (the
    output of its data preprocessor). The data samples go along: two-stage detectors need the
    image metas between the RPN and the RoI head."""
    return complexity(_TensorForward(model, data['data_samples']), (data['inputs'],))
