"""Parameters and multiply-accumulates with mmengine's analysis tools.

mmengine's ``FlopAnalyzer`` counts one fused multiply-add as one "flop", i.e. MACs. It has no
handle for ``scaled_dot_product_attention``, so attention would count as free; we add one.
Papers differ on whether softmax attention's products (QKᵀ and AV) count: RePaFormer's Table 1
leaves them out for most rows, its Table 2 counts them (docs/backbones/repa_vit.md#folds).
``attention_matmuls=False`` counts as the former: ``scaled_dot_product_attention`` as free.
Matrix products written out (SLAB's linear attention, a random mixing) count either way.
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


def no_macs(inputs: List[Any], outputs: List[Any]) -> int:
    """An operation counted as free (and not reported as unsupported)."""
    return 0


def complexity(model: nn.Module, inputs, attention_matmuls: bool = True) -> dict:
    """``dict(params=..., macs=...)`` of ``model(*inputs)`` (MACs of one forward), with or
    without softmax attention's QKᵀ and AV products."""
    analyzer = FlopAnalyzer(model, inputs)
    handle = sdpa_macs if attention_matmuls else no_macs
    analyzer.set_op_handle('aten::scaled_dot_product_attention', handle)
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


def model_complexity(model: nn.Module, data: dict, attention_matmuls: bool = True) -> dict:
    """:func:`complexity` of a detector's or segmentor's tensor forward on ``data`` (the
    output of its data preprocessor). The data samples go along: two-stage detectors need the
    image metas between the RPN and the RoI head."""
    forward = _TensorForward(model, data['data_samples'])
    return complexity(forward, (data['inputs'],), attention_matmuls)
