"""mmdeploy rewrites that mmrepa models need (registered when :mod:`mmrepa.integrations.mmdeploy`
is imported).

mmdeploy applies them while it exports (inside its ``RewriterContext``); outside an export
nothing changes.

1. ``torch.onnx.export``: torch >= 2.9 exports with the dynamo exporter unless told otherwise.
   mmdeploy 1.3.1 calls ``torch.onnx.export`` without ``dynamo=``, and its rewriters and
   symbolics (NMS, RoIAlign, ...) exist for the TorchScript exporter only, which also needs no
   ``onnxscript``. The rewrite passes ``dynamo=False``.
2. Attention. mmdeploy replaces ``F.scaled_dot_product_attention`` with its own decomposition
   for every backend but TensorRT. That decomposition divides the logits by ``scale`` (the
   argument is a multiplier), fails on boolean masks (``not tensor``) and exports its dropout in
   training mode. mmrepa's attention passes an explicit scale (Swin's window attention, the
   joined ViT attention before folding) or a boolean key mask (CAFormer's windowed attention on
   padded maps), so its results would change silently or the export would fail. mmdet's Swin
   escapes this only because it does not call SDPA. Every mmrepa method that calls SDPA is
   rewritten to run with :func:`exact_sdpa` instead, the same arithmetic as PyTorch's
   reference implementation written in ops every ONNX opset has (MatMul, Softmax).
3. mmcv's ``RoIAlign`` (Mask R-CNN's and every two-stage detector's RoI extractor): mmdeploy's
   ONNX Runtime symbolic imports ``_cast_Long`` from ``torch.onnx.symbolic_opset9``, which torch
   >= 2.9 no longer has, so the export stops with an ImportError. The symbolic below writes the
   same standard ``RoiAlign`` node (ONNX Runtime runs it natively) from plain graph ops. From
   opset 16 on, ``RoiAlign``'s ``half_pixel`` mode is mmcv's ``aligned=True`` exactly; before,
   the boxes are shifted by half a pixel instead, and ONNX Runtime then stretches RoIs smaller
   than one feature pixel to one pixel (different features for small boxes): the deploy configs
   in ``configs/deploy/`` use opset 17.
4. ``F.adaptive_avg_pool2d`` (UperNet's pyramid pooling): mmdeploy replaces it by an
   ``avg_pool2d`` whose kernel is ``int(size / output_size)``. That is exact only when the map
   divides by the output size; otherwise the windows are wrong (ADE20K's 512 px crop gives a
   16 x 16 last map, pooled to 3 x 3 and 6 x 6), and on a map smaller than the output (the demo
   UperNet's 2 x 2 map, pooled to 6 x 6) the kernel is 0 and the export fails with "stride
   should not be zero". For ONNX Runtime the rewrite below pools exactly: a global mean, an
   ``avg_pool2d`` when the sizes divide, else two constant averaging matrices with PyTorch's
   adaptive windows (rows ``floor(i H / n)`` to ``ceil((i + 1) H / n)``).
5. ``RewriterContext`` exit: mmdeploy 1.3.1 undoes its additions to ``torch.fx``'s registry of
   wrapped functions with ``list.pop(-1)``, but torch keeps that registry in a dict. The first
   context of a process that added to it raised ``KeyError: -1`` on exit, before it put back
   the functions it had rewritten (``torch.linspace``, ``F.adaptive_avg_pool2d``, ... stayed
   mmdeploy's for the rest of the process). The exit below removes the dict's newest entries
   first, as the list's ``pop`` did.
6. Finding a rewrite's context: ``FUNCTION_REWRITER.get_context()`` (every rewrite, mmdeploy's
   and these, calls it) finds the calling rewrite through ``inspect.stack()``, which reads the
   source line of every frame on the stack and, for frames without a file (the import
   system's), searches all of ``sys.modules`` for their module. :func:`frame_func` takes the
   same frame without reading anything, which makes an export much shorter (measured in
   docs/speed.md, "Overheads of the tools and the tests").

The attention rewrites key on mmrepa's own methods (mmdeploy's Swin rewrites key on mmdet's
``WindowMSA`` / ``ShiftWindowMSA`` and never apply to mmrepa's). mmrepa's shifted-window
attention needs no replacement for ``torch.roll`` or dynamic padding: its window layout (pad,
shift, partition) is one index gather whose indices are computed from the map size and exported
as constants, hence the static-shape deploy configs (``configs/deploy/``). 3 and 4 replace
mmdeploy's default rewrites for the ``onnxruntime`` and ``openvino`` backends only (a
backend-specific rewrite takes precedence over a default one).
:mod:`mmrepa.integrations.mmdeploy.mmdet_heads` does the same for the RetinaNet, RPN and R-CNN
post-processing.
"""

import contextlib
import functools
import inspect
import math
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from mmdeploy.core import FUNCTION_REWRITER, SYMBOLIC_REWRITER
from mmdeploy.core.rewriters import function_rewriter, symbolic_rewriter
from mmdeploy.utils import get_ir_config
from torch.nn.modules.utils import _pair

# the backends mmrepa's exact rewrites apply to: both run the same standard-op ONNX graph
# (OpenVINO converts it, see :mod:`mmrepa.integrations.mmdeploy.openvino`)
BACKENDS = ('onnxruntime', 'openvino')


def for_backends(register, *args, **kwargs):
    """``register(*args, backend=b, **kwargs)`` for each of :data:`BACKENDS`, as one decorator
    (``register``: ``FUNCTION_REWRITER.register_rewriter`` or
    ``SYMBOLIC_REWRITER.register_symbolic``)."""

    def decorator(func):
        for backend in BACKENDS:
            register(*args, backend=backend, **kwargs)(func)
        return func

    return decorator


def _exit_with_dict_registry(exit):
    @functools.wraps(exit)
    def wrapped(self):
        registry = function_rewriter._wrapped_fns_to_patch
        if isinstance(registry, dict):  # newest first, as list.pop(-1); then exit pops none
            while len(registry) > self._ori_fx_wrap_num:
                registry.popitem()
        return exit(self)

    wrapped.mmrepa_dict_registry = True
    return wrapped


if not getattr(function_rewriter.FunctionRewriter.exit, 'mmrepa_dict_registry', False):
    function_rewriter.FunctionRewriter.exit = _exit_with_dict_registry(
        function_rewriter.FunctionRewriter.exit
    )


def frame_func(top: int = 1):
    """The function whose frame is ``top`` frames up from this call (1: the caller's), by the
    name it runs under in its module's globals: what mmdeploy's ``get_frame_func`` returns,
    without ``inspect.stack()`` (point 6)."""
    frame = inspect.currentframe()
    for _ in range(top):
        frame = frame.f_back
    name = frame.f_code.co_name
    assert name in frame.f_globals, f'Can not find function: {name} in global.'
    return frame.f_globals[name]


for _module in (function_rewriter, symbolic_rewriter):  # where get_context looks it up
    _module.get_frame_func = frame_func


def exact_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` for inference, as MatMul / Softmax / MatMul.

    ``scale`` multiplies the logits (default ``1 / sqrt(head_dim)``); a boolean ``attn_mask``
    marks the keys a query may attend (True), a float one is added to the logits. Dropout,
    causal masks and grouped-query attention are training or decoder features an exported
    mmrepa backbone does not use: they are refused rather than approximated.
    """
    if dropout_p or is_causal or enable_gqa:
        raise NotImplementedError(
            'exact_sdpa exports inference attention only: dropout_p=0, is_causal=False, '
            f'enable_gqa=False (got dropout_p={dropout_p}, is_causal={is_causal}, '
            f'enable_gqa={enable_gqa})'
        )
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    logits = (query * scale) @ key.transpose(-2, -1)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            # the most negative finite value: exp() of it is 0 once the row maximum (a real
            # key's logit) is subtracted, and -inf would be NaN in some runtimes
            logits = logits.masked_fill(~attn_mask, torch.finfo(logits.dtype).min)
        else:
            logits = logits + attn_mask.to(logits.dtype)
    return torch.softmax(logits, dim=-1) @ value


@contextlib.contextmanager
def _exact_sdpa():
    """``F.scaled_dot_product_attention`` is :func:`exact_sdpa` inside (mmrepa's layers look
    it up as ``F.scaled_dot_product_attention`` at call time)."""
    current = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = exact_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = current


# Every mmrepa method that calls F.scaled_dot_product_attention.
# tests/integration/test_mmdeploy.py checks that this list stays complete.
SDPA_METHODS = (
    'mmrepa.backbones.swin.window_attention.WindowMSA.attend',
    'mmrepa.layers.windowed_self_attention.WindowedSelfAttention._attend',
    'mmrepa.backbones.depth_rep_vit.attention.JoinedAttention._attend',
    'mmrepa.backbones.depth_rep_vit.attention.JoinedAttention._per_branch',
    'mmrepa.backbones.depth_rep_vit.attention.JoinedAttention._joined_logits',
    'mmrepa.backbones.prepbn_pvt.SpatialReductionAttention.forward',
)


def _run_with_exact_sdpa(*args, **kwargs):
    ctx = FUNCTION_REWRITER.get_context()
    with _exact_sdpa():
        return ctx.origin_func(*args, **kwargs)


for _method in SDPA_METHODS:
    FUNCTION_REWRITER.register_rewriter(func_name=_method, backend='default')(_run_with_exact_sdpa)


@FUNCTION_REWRITER.register_rewriter(func_name='torch.onnx.export', backend='default')
def torch_onnx_export__torchscript(*args, **kwargs):
    """``torch.onnx.export`` with the TorchScript exporter that mmdeploy's rewrites target."""
    ctx = FUNCTION_REWRITER.get_context()
    kwargs.setdefault('dynamo', False)
    with warnings.catch_warnings():
        # "legacy exporter" notices, and sizes becoming constants: intended for static shapes
        warnings.simplefilter('ignore', DeprecationWarning)
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        return ctx.origin_func(*args, **kwargs)


@for_backends(SYMBOLIC_REWRITER.register_symbolic, 'mmcv.ops.roi_align.__self__')
def roi_align__onnxruntime(
    g,
    input,
    rois,
    output_size,
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: str,
    aligned: bool,
):
    """mmcv ``RoIAlignFunction`` as ONNX ``RoiAlign``. ``rois`` (K, 5) are (batch index,
    x1, y1, x2, y2); ONNX takes the indices (int64) and boxes apart. mmcv's ``aligned=True``
    (shift by -0.5 px) is RoiAlign-16's ``half_pixel`` mode; before opset 16 the shift is
    applied to the boxes."""
    ctx = SYMBOLIC_REWRITER.get_context()
    opset = get_ir_config(ctx.cfg).get('opset_version', 11)

    def const(value, dtype=torch.long):
        return g.op('Constant', value_t=torch.tensor(value, dtype=dtype))

    batch_indices = g.op(
        'Cast', g.op('Gather', rois, const(0), axis_i=1), to_i=7
    )  # TensorProto.INT64
    boxes = g.op('Gather', rois, const([1, 2, 3, 4]), axis_i=1)
    attrs = dict(
        output_height_i=output_size[0],
        output_width_i=output_size[1],
        spatial_scale_f=spatial_scale,
        sampling_ratio_i=sampling_ratio,
        mode_s=pool_mode,
    )
    if opset >= 16:
        attrs['coordinate_transformation_mode_s'] = 'half_pixel' if aligned else 'output_half_pixel'
    elif aligned:
        boxes = g.op('Sub', boxes, const(0.5 / spatial_scale, torch.float))
    return g.op('RoiAlign', input, boxes, batch_indices, **attrs)


def _adaptive_windows(size: int, out: int, like: torch.Tensor) -> torch.Tensor:
    """(out, size) matrix whose row i averages PyTorch's adaptive pooling window i."""
    weights = torch.zeros(out, size, dtype=like.dtype, device=like.device)
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        weights[i, start:end] = 1.0 / (end - start)
    return weights


@for_backends(FUNCTION_REWRITER.register_rewriter, 'torch.nn.functional.adaptive_avg_pool2d')
def adaptive_avg_pool2d__onnxruntime(input: torch.Tensor, output_size) -> torch.Tensor:
    """Exact adaptive average pooling for a static input size (see the module docstring)."""
    ctx = FUNCTION_REWRITER.get_context()
    H, W = int(input.shape[-2]), int(input.shape[-1])
    out_h, out_w = (s if s is not None else full for s, full in zip(_pair(output_size), (H, W)))
    if out_h == out_w == 1:
        return ctx.origin_func(input, 1)  # GlobalAveragePool
    if H % out_h == 0 and W % out_w == 0:
        kernel = (H // out_h, W // out_w)
        return F.avg_pool2d(input, kernel, stride=kernel)
    rows = _adaptive_windows(H, out_h, input)  # (out_h, H)
    cols = _adaptive_windows(W, out_w, input).t()  # (W, out_w)
    return torch.matmul(torch.matmul(rows, input), cols)
