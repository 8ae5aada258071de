"""ONNX export of folded backbones: onnxruntime agrees with PyTorch on awkward input sizes."""

import pytest
import torch

from mmrepa import reparameterize
from mmrepa.backbones import CAFormer, PRepBNSwin, RePaSwin
from mmrepa.integrations.onnx import (
    TensorForward,
    export_onnx,
    onnx_max_abs_error,
    onnxruntime_session,
)
from tests.helpers import TINY_ARCH, randomize_

pytest.importorskip('onnxruntime')


def folded(model):
    return reparameterize(randomize_(model).eval())


@pytest.mark.parametrize(
    'name, build',
    [
        ('repa_swin', lambda: RePaSwin(arch=TINY_ARCH, window_size=4, idle_ratio=0.75)),
        # folded norms write padded_qkv over the padding tokens; linear attention in stages 1-2
        (
            'slab_swin',
            lambda: PRepBNSwin(
                arch=TINY_ARCH,
                window_size=4,
                idle_ratio=0.5,
                attn_types='LLSS',
                linear_window_sizes=(8, 4, 4, 4),
            ),
        ),
        (
            'repa_caformer',
            lambda: CAFormer(
                arch=dict(depths=(1, 1, 2, 1), dims=(16, 32, 48, 64)),
                head_dim=16,
                window_size=(None, None, 3, 2),
                idle_ratio=0.75,
            ),
        ),
    ],
)
def test_folded_backbone_exports_and_onnxruntime_agrees(name, build, tmp_path):
    model = folded(build())
    x = torch.randn(1, 3, 75, 101)  # not a multiple of the windows: padding and shifted masks
    path = str(tmp_path / f'{name}.onnx')
    export_onnx(model, x, path)
    assert onnx_max_abs_error(model, x, onnxruntime_session(path)) < 1e-4


def test_export_reports_a_shape_mismatch(tmp_path):
    model = folded(RePaSwin(arch=TINY_ARCH, window_size=4))
    path = str(tmp_path / 'm.onnx')
    export_onnx(model, torch.randn(1, 3, 64, 64), path)
    # the graph is for the traced shape only; another size is refused, not silently wrong
    with pytest.raises(
        ValueError,
        match=r'exported for input \(1, 3, 64, 64\) but got '
        r'\(1, 3, 96, 64\): export it again',
    ):
        onnx_max_abs_error(model, torch.randn(1, 3, 96, 64), onnxruntime_session(path))


def test_full_export_leaves_batchnorm_statistics_alone(tmp_path):
    """tools/export_onnx.py --full wraps the model; the export runs in the model's own (eval)
    mode, so BatchNorm statistics are read, not updated."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x, mode='tensor'):
            return self.bn(self.conv(x))

    model = Model().eval()
    before = model.bn.running_mean.clone()
    wrapper = TensorForward(model)
    export_onnx(wrapper, torch.randn(2, 3, 8, 8) * 5 + 3, str(tmp_path / 'm.onnx'))
    assert torch.equal(model.bn.running_mean, before) and not model.training
