"""SessionModel: a backend session in an mmdet model's place gives, from an image file through
mmdet's own inference_detector, the PyTorch model's detections."""

import numpy as np
import pytest
import torch
from PIL import Image

from mmrepa import reparameterize
from mmrepa.apis import init_model
from mmrepa.integrations.onnx import TensorForward, export_onnx, onnxruntime_session
from mmrepa.integrations.quantize import SessionModel, plain_metrics
from tests.helpers import demo_cfg

pytest.importorskip('onnxruntime')
inference_detector = pytest.importorskip('mmdet.apis').inference_detector


@pytest.fixture(scope='module')
def detector(tmp_path_factory):
    """The demo RetinaNet as initialised, folded; an image file of another size than the
    test pipeline's (so that rescaling the boxes to it matters)."""
    root = tmp_path_factory.mktemp('session_model')
    cfg = demo_cfg(str(root) + '/', str(root / 'work'))
    cfg.model.test_cfg.update(score_thr=0.0, max_per_img=20)
    model = reparameterize(init_model(cfg).eval())  # randomize_ would leave no detections
    image = str(root / 'image.png')
    pixels = np.random.default_rng(0).integers(0, 256, size=(50, 70, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image)
    return model, image, root


@pytest.mark.parametrize('full', [False, True], ids=['backbone', 'tensor-forward'])
def test_session_model_detects_as_the_model(detector, full):
    model, image, root = detector
    with torch.no_grad():
        ref = inference_detector(model, image)
    h, w = ref.metainfo['batch_input_shape']
    path = str(root / f'{full}.onnx')
    export_onnx(TensorForward(model) if full else model.backbone, torch.randn(1, 3, h, w), path)
    got = inference_detector(SessionModel(model, onnxruntime_session(path, 1), full), image)
    a, b = ref.pred_instances, got.pred_instances
    assert len(a) == 20 and len(b) == len(a)
    assert torch.equal(a.labels, b.labels)
    assert (a.scores - b.scores).abs().max() < 1e-5
    assert (a.bboxes - b.bboxes).abs().max() < 1e-3


def test_metrics_become_floats_and_per_class_lists():
    """As an evaluator may return them: numpy and 0-d torch scalars, a per-class list (mmpretrain's
    SingleLabelMetric with average=None), a per-class array or tensor."""
    metrics = {
        'map': np.float64(0.25),
        'acc': torch.tensor(0.5),
        'per_class': [100.0, 0.0],
        'per_class_array': np.array([0.5, 0.75]),
        'per_class_tensor': torch.tensor([1.0, 0.0]),
    }
    plain = plain_metrics(metrics)
    assert plain == {
        'map': 0.25,
        'acc': 0.5,
        'per_class': [100.0, 0.0],
        'per_class_array': [0.5, 0.75],
        'per_class_tensor': [1.0, 0.0],
    }
    assert all(
        type(x) is float for v in plain.values() for x in (v if isinstance(v, list) else [v])
    )
