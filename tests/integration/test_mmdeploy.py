"""Whole models through mmdeploy 1.3.1: RetinaNet, Mask R-CNN and UperNet with folded mmrepa
backbones export to ONNX (tools/deploy.py, configs/deploy/) and ONNX Runtime gives PyTorch's
boxes, labels, masks and class maps; what cannot be exported is refused without leaving files;
tools/image_demo.py runs an export on new images as it runs the PyTorch model.

Tiny demo models (configs/demo, random weights with non-trivial BatchNorm statistics) on small
generated data. The detectors are traced at 96 x 96, so the window attention pads (the last
stages' 6 x 6 and 3 x 3 maps against windows of 4) and shifts; the UperNet at 48 x 48, where
its pyramid pooling takes a 2 x 2 map to 3 x 3 and 6 x 6."""

import ast
import contextlib
import importlib.util
import json
import logging
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.nn.modules.batchnorm import _BatchNorm

pytest.importorskip('onnxruntime')
pytest.importorskip('mmdeploy')

import mmrepa  # noqa: E402
from mmrepa.apis import init_model  # noqa: E402
from mmrepa.datasets import make_shapes_ade20k, make_shapes_coco  # noqa: E402
from tests.helpers import (  # noqa: E402
    ROOT,
    parse_options,
    run_script_here,
    script_module,
    shapes_cfg_options,
)

DEMO = osp.join(ROOT, 'configs', 'demo')
DEPLOY = osp.join(ROOT, 'configs', 'deploy')
TOOL = 'tools/deploy.py'
needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec('openvino') is None, reason='needs openvino (.[openvino])'
)


@pytest.fixture(scope='module', autouse=True)
def _rewrites():
    """mmrepa's mmdeploy rewrites, imported when this module's tests run: the import takes
    ~6 s, which collection would make every test worker pay."""
    import mmrepa.integrations.mmdeploy  # noqa: F401


def random_checkpoint(config, options, path, seed=0):
    """The config's model with its own initialisation (mmdet's head priors included), every
    weight perturbed (an initialised head scores all anchors nearly alike: their order would be
    float noise) and random BatchNorm statistics, so that the folds have something to fold;
    saved to ``path``."""
    torch.manual_seed(seed)
    model = init_model(config, cfg_options=parse_options(options))
    model.init_weights()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    torch.save(
        dict(state_dict=model.state_dict(), meta=dict(dataset_meta=model.dataset_meta)), path
    )
    return path


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('mmdeploy')
    coco = make_shapes_coco(str(root / 'shapes'), num_train=1, num_val=2, size=96) + '/'
    ade = make_shapes_ade20k(str(root / 'ade'), num_train=1, num_val=2, size=48) + '/'
    return root, coco, ade


def detector_options(coco):
    # trace at 96 x 96 (the demo resizes to 128): maps of 24, 12, 6, 3 against windows of 4
    return shapes_cfg_options(coco) + ['test_pipeline.1.scale=(96,96)']


def upernet_options(ade):
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [
            f'{loader}.dataset.data_root={ade}',
            f'{loader}.num_workers=0',
            f'{loader}.persistent_workers=False',
        ]
    return options


CASES = {
    'retinanet': ('retinanet_repa_swin_shapes.py', 'detection_onnxruntime_static.py'),
    'mask-rcnn': ('mask-rcnn_prepbn_swin_shapes.py', 'instance-seg_onnxruntime_static.py'),
    'upernet': ('upernet_repa_convformer_shapes.py', 'segmentation_onnxruntime_static.py'),
}


@pytest.fixture(scope='module')
def exports(data, tmp_path_factory):
    """``exports(name, backend)``: tools/deploy.py run once per model and backend in this
    module, on a random checkpoint: (the folder it ran in, the output folder, the report, the
    log, the image it compared on)."""
    root, coco, ade = data
    done = {}

    def export(name, backend='onnxruntime'):
        if (name, backend) in done:
            return done[name, backend]
        folder = tmp_path_factory.mktemp(f'{name}-{backend}')
        config = osp.join(DEMO, CASES[name][0])
        deploy_cfg = osp.join(DEPLOY, CASES[name][1].replace('onnxruntime', backend))
        options = upernet_options(ade) if name == 'upernet' else detector_options(coco)
        ckpt = random_checkpoint(config, options, str(folder / 'model.pth'))
        out = folder / 'out'
        # RetinaNet exports the config's first test image (the default); the others a given one
        image = {
            'retinanet': osp.join(coco, 'val', '00000.png'),
            'mask-rcnn': osp.join(coco, 'val', '00001.png'),
            'upernet': osp.join(ade, 'images', 'validation', 'shapes_validation_00001.jpg'),
        }[name]
        given = [] if name == 'retinanet' else ['--image', image]
        with pytest.MonkeyPatch.context() as mp:  # a line per 0.05 s of each step
            mp.setenv('MMREPA_PROGRESS_INTERVAL', '0.05')
            report, log = run_script_here(
                TOOL, config, ckpt, deploy_cfg, '--out', out, *given, '--cfg-options', *options
            )
        done[name, backend] = folder, out, report, log, image
        return done[name, backend]

    return export


def assert_equal_to_pytorch(name, backend, report, result):
    assert report['folded'] and report['params_after'] < report['params_before']
    if name == 'upernet':
        assert report['input_shape'] == [48, 48]
        assert result['differing_pixels'] == 0 and result['pixels'] == 48 * 48
    else:
        assert report['input_shape'] == [96, 96]
        assert result['num_pytorch'] == result[f'num_{backend}'] > 0
        assert result['labels_equal']
        assert result['max_box_diff'] < 1e-3 and result['max_score_diff'] < 1e-4
        if name == 'mask-rcnn':
            assert result['min_mask_iou'] > 0.99


@pytest.mark.parametrize(
    'name, backend',
    [(name, 'onnxruntime') for name in CASES]
    # OpenVINO through the tool for the segmentor (the detector: below, from the ONNX graph)
    + [pytest.param('upernet', 'openvino', marks=needs_openvino)],
)
def test_whole_model_exports_and_the_backend_equals_pytorch(name, backend, exports):
    folder, out, report, log, image = exports(name, backend)
    ir = ['end2end.bin', 'end2end.xml'] if backend == 'openvino' else []
    assert sorted(os.listdir(out)) == sorted(
        ['deploy_cfg.py', 'end2end.onnx', 'folded.pth', 'model_cfg.py', 'report.json', *ir]
    )
    with open(out / 'report.json') as f:
        assert json.load(f) == report
    assert report['backend'] == backend and report['image'] == osp.abspath(image)
    assert_equal_to_pytorch(name, backend, report, report[f'{backend}_vs_pytorch'])
    assert f'{backend} vs PyTorch' in log
    assert f'{TOOL}: exporting to ONNX with mmdeploy (running for 0 s)' in log  # progress
    # nothing left beside the output but the checkpoint
    assert sorted(os.listdir(folder)) == ['model.pth', 'out']


@needs_openvino
def test_openvino_runs_the_exported_mask_rcnn_as_pytorch(exports, tmp_path):
    """The Mask R-CNN graph tools/deploy.py exported (the same for both backends: mmrepa's
    rewrites apply to both, and mmdeploy's OpenVINO RoI extractor is not used), converted by the
    OpenVINO backend manager mmrepa registers with mmdeploy and run by mmdeploy's backend model,
    gives PyTorch's boxes, labels and masks."""
    from mmengine.config import Config

    from mmrepa.apis import init_model

    _, out, report, _, image = exports('mask-rcnn')
    deploy_cfg = Config.fromfile(osp.join(DEPLOY, 'instance-seg_openvino_static.py'))
    model_cfg = Config.fromfile(str(out / 'model_cfg.py'))
    model = init_model(model_cfg, str(out / 'folded.pth'))
    deploy = script_module(TOOL)
    result, files, shape = deploy.run_backend(
        model, model_cfg, deploy_cfg, str(out / 'end2end.onnx'), image, str(tmp_path)
    )
    assert [osp.basename(f) for f in files] == ['end2end.xml']
    assert sorted(os.listdir(tmp_path)) == ['end2end.bin', 'end2end.xml']
    assert_equal_to_pytorch('mask-rcnn', 'openvino', dict(report, input_shape=shape), result)
    assert (
        deploy.disagreement(result, deploy.parse_args(['c', 'k', 'd', '--out', 'o']), 'openvino')
        == ''
    )


@needs_openvino
def test_openvino_reads_the_window_layout_as_mmdeploy_exports_it(tmp_path):
    """mmdeploy exports ``Tensor.__setitem__`` as Slice + Concat; the window layout of a map of
    whole windows (nothing to pad) once assigned an empty padding region, exported as an empty
    constant that OpenVINO's ONNX reader refused (the demo Mask R-CNN at 128 x 128). Maps that
    pad: the Mask R-CNN above, traced at 96 x 96."""
    hw = (8, 8)
    from mmdeploy.core import RewriterContext
    from mmengine.config import Config

    from mmrepa.backbones.swin import window_layout
    from mmrepa.integrations.openvino import OpenVINOSession

    class Windows(torch.nn.Module):
        def forward(self, x):
            layout = window_layout(*hw, 4, 2, x.device)
            return x[:, layout.gather], layout.scatter.float()

    x = torch.randn(1, hw[0] * hw[1])
    path = str(tmp_path / 'layout.onnx')
    cfg = Config.fromfile(osp.join(DEPLOY, 'instance-seg_openvino_static.py'))
    with RewriterContext(cfg=cfg, backend='openvino', opset=17):
        torch.onnx.export(Windows(), (x,), path, input_names=['input'], dynamo=False)
    got = OpenVINOSession(path).run(None, {'input': x.numpy()})
    for out, ref in zip(got, Windows()(x)):
        torch.testing.assert_close(torch.from_numpy(out), ref, rtol=0, atol=0)


def test_openvino_exports_with_the_rewrites_onnxruntime_gets():
    """Under the openvino backend the graph is written by the same rewrites as for ONNX Runtime
    (mmrepa's exact ones registered for both; mmdeploy's OpenVINO SingleRoIExtractor, which
    assigns RoIs to levels by its own rule, removed), except two of mmdeploy's that do not touch
    these models' results: its ONNX Runtime masked_fill workaround and OpenVINO's deformable
    convolution op."""
    from mmdeploy.core import FUNCTION_REWRITER, SYMBOLIC_REWRITER
    from mmdeploy.core.rewriters.rewriter_utils import collect_env
    from mmdeploy.utils import IR, Backend

    for codebase in ('mmdet', 'mmseg'):
        importlib.import_module(f'mmdeploy.codebase.{codebase}.models')
    differ = set()
    for registry in (FUNCTION_REWRITER, SYMBOLIC_REWRITER):
        ort, ov = (
            {k: v['_object'] for k, v in registry._registry.get_records(collect_env(b, IR.ONNX))}
            for b in (Backend.ONNXRUNTIME, Backend.OPENVINO)
        )
        differ |= {k for k in set(ort) | set(ov) if ort.get(k) is not ov.get(k)}
        ours = [k for k, f in ov.items() if f.__module__.startswith('mmrepa')]
        assert ours, 'no mmrepa rewrite registered for openvino'
    assert differ == {
        'torch.masked_fill',
        'torch.Tensor.masked_fill',
        'mmcv.ops.deform_conv.DeformConv2dFunction',
    }


# ------------------------------------------------------- the exported model on new images

DEMO_TOOL = 'tools/image_demo.py'
# tools/image_demo.py's detection line; printed boxes have 1 decimal, scores 3
DETECTION = re.compile(r'^(\S+) +score (\d\.\d{3})  box +(\S+) +(\S+) +(\S+) +(\S+)$')


@contextlib.contextmanager
def mmengine_messages():
    """The warnings mmengine's current logger is told inside (mmengine's registry warns there):
    a logger created earlier in this process writes to the stream of its creation, not to what
    run_script_here captures (one the run creates does)."""
    from mmengine.logging import MMLogger

    records, handler = [], logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def read_png(path):
    with Image.open(path) as im:
        assert im.format == 'PNG'
        return np.asarray(im.convert('RGB'))


def printed_per_image(log):
    """The lines image_demo.py printed for each image of a folder: name -> lines."""
    parts = re.split(r'^(\S+\.(?:png|jpg)):$', log, flags=re.M)
    return {
        osp.basename(image): text.split('\nwrote ')[0].strip().splitlines()
        for image, text in zip(parts[1::2], parts[2::2])
    }


def assert_same_printed_detections(deployed, pytorch):
    """Instance by instance, paired by label and box (scores equal up to float noise may come in
    either order). tools/deploy.py's check bounds the boxes' difference to 1e-3 px and the
    scores' to 1e-4 (test_whole_model_exports_...): printed to 0.1 px and 0.001, they round
    apart by at most one unit of the last digit."""
    assert deployed[0] == pytorch[0] and len(deployed) == len(pytorch)  # 'N detection(s) ...'
    free = [DETECTION.match(line).groups() for line in deployed[1:]]
    for line in pytorch[1:]:
        label, score, *box = DETECTION.match(line).groups()
        same = [
            got
            for got in free
            if got[0] == label
            and abs(float(got[1]) - float(score)) <= 1e-3 + 1e-4
            and max(abs(float(a) - float(b)) for a, b in zip(got[2:], box)) <= 0.1 + 1e-3
        ]
        assert same, f'no deployed counterpart of {line!r} in {deployed}'
        free.remove(same[0])


@pytest.mark.parametrize(
    'name, backend',
    [('retinanet', 'onnxruntime'), pytest.param('upernet', 'openvino', marks=needs_openvino)],
)
def test_image_demo_runs_the_deployed_model_as_pytorch(name, backend, exports, data, tmp_path):
    """``tools/image_demo.py DIR FOLDER --out-dir OUT``, DIR a tools/deploy.py output, prints
    the PyTorch model's predictions on every image (other images than the export's too) and
    draws them, without mmengine's registry-scope warnings."""
    folder, out, _, _, image = exports(name, backend)
    _, coco, ade = data
    if name == 'upernet':
        options = upernet_options(ade)
    else:  # inference_detector reads the test loader's pipeline, mmdeploy test_pipeline
        options = detector_options(coco) + ['test_dataloader.dataset.pipeline.1.scale=(96,96)']
    images = osp.dirname(image)
    with mmengine_messages() as records:
        _, log = run_script_here(
            DEMO_TOOL, out, images, '--out-dir', tmp_path / 'deployed', '--score-thr', '0'
        )
    messages = log + '\n'.join(r.getMessage() for r in records)
    # mmengine's scope warnings: 'Failed to search registry ...', 'Failed to import `X.registry`'
    assert 'registry' not in messages, messages
    _, reference = run_script_here(
        DEMO_TOOL,
        osp.join(DEMO, CASES[name][0]),
        folder / 'model.pth',
        images,
        '--out-dir',
        tmp_path / 'pytorch',
        '--score-thr',
        '0',
        '--cfg-options',
        *options,
    )
    deployed, pytorch = printed_per_image(log), printed_per_image(reference)
    assert sorted(deployed) == sorted(pytorch) == sorted(os.listdir(images))
    for picture, lines in pytorch.items():
        if name == 'upernet':  # tools/deploy.py allows no differing class-map pixel
            assert deployed[picture] == lines and len(lines) > 1
        else:
            assert_same_printed_detections(deployed[picture], lines)
        drawn = read_png(tmp_path / 'deployed' / (osp.splitext(picture)[0] + '.png'))
        source = np.asarray(Image.open(osp.join(images, picture)).convert('RGB'))
        assert drawn.shape == source.shape and (drawn != source).any()  # drawn on the image
    assert f'(folded model in {backend})' in log


def test_image_demo_refuses_in_one_line_what_the_deployed_model_cannot_take(exports, tmp_path):
    _, out, _, _, image = exports('retinanet')
    wide = tmp_path / 'wide.png'  # the pipeline keeps its ratio: 96 x 64, not the traced 96 x 96
    Image.open(image).crop((0, 0, 96, 64)).save(wide)
    cases = [
        ((tmp_path, image), f'{tmp_path} is not a tools/deploy.py output folder (no report.json'),
        ((out, image, '--reparam'), '--reparam and --cfg-options are for CONFIG CHECKPOINT'),
        ((out, wide), 'the test pipeline makes it 64 x 96, but the model in'),
    ]
    for args, message in cases:
        _, log = run_script_here(DEMO_TOOL, *args, '--out-file', tmp_path / 'p.png', ok=False)
        assert message in log.strip().splitlines()[-1] and 'Traceback' not in log, log[-2000:]
    _, log = run_script_here(DEMO_TOOL, out, image, '--out-dir', out, ok=False)
    assert log.strip().endswith('an output never replaces an input; write it elsewhere'), log
    assert sorted(os.listdir(tmp_path)) == ['wide.png']


@pytest.mark.parametrize('tool', ['tools/image_demo.py', 'tools/deploy.py', 'tools/quantize.py'])
def test_help_describes_the_tool_in_full_sentences(tool):
    """--help's description is the docstring's whole first paragraph, not its first line."""
    _, log = run_script_here(tool, '--help')
    doc = script_module(tool).__doc__
    assert ''.join(doc.split('\n\n')[0].split()) in ''.join(log.split())


def _refused(tmp_path, *args):
    out = tmp_path / 'new' / 'out'
    _, log = run_script_here(TOOL, *args, '--out', out, ok=False)
    assert not (tmp_path / 'new').exists()  # nor the directories made for it
    assert [p for p in os.listdir(tmp_path) if p.startswith('.')] == []  # no temporary dir
    return log.strip().splitlines()[-1]


def test_a_model_mmdeploy_cannot_export_is_refused_with_the_reason(data, tmp_path):
    """Soft-NMS runs in PyTorch, but mmdeploy has no export for it: the export fails after the
    fold, mid-trace; the message says what and why, and nothing is left behind."""
    _, coco, _ = data
    config = osp.join(DEMO, CASES['retinanet'][0])
    options = detector_options(coco) + ['model.test_cfg.nms.type=soft_nms']
    ckpt = random_checkpoint(config, options, str(tmp_path / 'model.pth'))
    line = _refused(
        tmp_path, config, ckpt, osp.join(DEPLOY, CASES['retinanet'][1]), '--cfg-options', *options
    )
    assert line.startswith(f'{TOOL}: cannot export {config}')
    assert 'mmdeploy could not export the folded RetinaNet' in line
    assert 'soft_nms' in line and 'nothing written to' in line
    assert sorted(os.listdir(tmp_path)) == ['model.pth']


@pytest.mark.parametrize(
    'config, deploy_cfg, reason',
    [
        (
            'classifier_repa_caformer_shapes.py',
            'detection_onnxruntime_static.py',
            "the model is mmpretrain's ImageClassifier, but the deploy config exports mmdet "
            'ObjectDetection models',
        ),
        (
            'upernet_repa_convformer_shapes.py',
            'detection_onnxruntime_static.py',
            'use configs/deploy/segmentation_onnxruntime_static.py',
        ),
        (
            'mask-rcnn_prepbn_swin_shapes.py',
            'detection_onnxruntime_static.py',
            'the MaskRCNN predicts masks',
        ),
        (
            'upernet_repa_convformer_shapes.py',
            'detection_openvino_static.py',
            'use configs/deploy/segmentation_openvino_static.py',
        ),
        ('retinanet_repa_swin_shapes.py', 'dynamic', 'dynamic input sizes'),
        ('retinanet_repa_swin_shapes.py', 'tensorrt', 'its backend is tensorrt'),
    ],
)
def test_what_the_deploy_config_cannot_export_is_refused_before_building(
    config, deploy_cfg, reason, tmp_path
):
    if deploy_cfg in ('dynamic', 'tensorrt'):
        path = tmp_path / f'{deploy_cfg}.py'
        extra = (
            "onnx_config = dict(dynamic_axes={'input': {0: 'batch', 2: 'h', 3: 'w'}})"
            if deploy_cfg == 'dynamic'
            else "backend_config = dict(type='tensorrt')"
        )
        path.write_text(f'_base_ = [{osp.join(DEPLOY, CASES["retinanet"][1])!r}]\n{extra}\n')
        deploy_cfg = str(path)
    else:
        deploy_cfg = osp.join(DEPLOY, deploy_cfg)
    ckpt = tmp_path / 'unused.pth'
    ckpt.write_bytes(b'')  # never read: the refusal comes first
    line = _refused(tmp_path, osp.join(DEMO, config), ckpt, deploy_cfg)
    assert 'cannot export' in line and reason in line, line


def test_a_backend_not_installed_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'openvino', None)  # import openvino fails
    config = osp.join(DEMO, CASES['upernet'][0])
    ckpt = tmp_path / 'unused.pth'
    ckpt.write_bytes(b'')
    line = _refused(tmp_path, config, ckpt, osp.join(DEPLOY, 'segmentation_openvino_static.py'))
    assert line.startswith(f'{TOOL}: needs openvino (') and '[openvino]' in line, line


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    config = osp.join(DEMO, CASES['retinanet'][0])
    _, log = run_script_here(
        TOOL, config, config, osp.join(DEPLOY, CASES['retinanet'][1]), '--out', out, ok=False
    )
    assert log.strip().endswith(f'{out} exists; pass --force to replace it')


# ------------------------------------------------------------------------ the rewrites alone


def test_exact_sdpa_is_pytorchs_attention():
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    float_mask = torch.randn(2, 1, 16, 16)
    bool_mask = torch.rand(2, 1, 16, 16) > 0.3
    bool_mask[..., 0] = True  # every query sees a key
    for kwargs in (
        dict(),
        dict(scale=0.37),
        dict(attn_mask=float_mask),
        dict(attn_mask=bool_mask, scale=1.0),
    ):
        torch.testing.assert_close(
            mmrepa.integrations.mmdeploy.exact_sdpa(q, k, v, **kwargs),
            F.scaled_dot_product_attention(q, k, v, **kwargs),
        )
    with pytest.raises(NotImplementedError, match='dropout_p'):
        mmrepa.integrations.mmdeploy.exact_sdpa(q, k, v, dropout_p=0.1)


def test_every_sdpa_call_in_mmrepa_is_rewritten():
    """mmdeploy's own replacement of F.scaled_dot_product_attention is wrong for an explicit
    scale and boolean masks: every mmrepa method calling it must be in SDPA_METHODS."""
    calls = set()
    package = osp.join(ROOT, 'mmrepa')
    for folder, _, files in os.walk(package):
        for name in files:
            if not name.endswith('.py') or osp.join(folder, name).startswith(
                osp.join(package, 'integrations', 'mmdeploy')  # the rewrites themselves
            ):
                continue
            path = osp.join(folder, name)
            module = osp.splitext(osp.relpath(path, ROOT))[0].replace(os.sep, '.')
            calls |= _sdpa_callers(ast.parse(open(path).read()), module)
    assert calls and calls == set(mmrepa.integrations.mmdeploy.SDPA_METHODS)


def _sdpa_callers(tree, prefix):
    found = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            path = f'{prefix}.{node.name}'
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(n, ast.Attribute) and n.attr == 'scaled_dot_product_attention'
                for n in ast.walk(node)
            ):
                found.add(path)
            else:
                found |= _sdpa_callers(node, path)
    return found


def test_adaptive_pooling_is_exact_under_the_onnxruntime_rewrites():
    from mmdeploy.core import RewriterContext
    from mmengine.config import Config

    cfg = Config.fromfile(osp.join(DEPLOY, CASES['upernet'][1]))
    x = torch.randn(2, 3, 16, 11)
    sizes = [1, 2, 3, 6, (4, None), (16, 11)]
    with RewriterContext(cfg=cfg, backend='onnxruntime', opset=11):
        pooled = [F.adaptive_avg_pool2d(x, s) for s in sizes]
        tiny = F.adaptive_avg_pool2d(x[..., :2, :2], 6)  # a map smaller than the output
    for out, s in zip(pooled, sizes):
        torch.testing.assert_close(out, F.adaptive_avg_pool2d(x, s))
    torch.testing.assert_close(tiny, F.adaptive_avg_pool2d(x[..., :2, :2], 6))


def _two_up(find, top):
    return _one_up(find, top)


def _one_up(find, top):
    return find(top)


def test_a_rewrite_finds_the_function_mmdeploy_finds():
    """mmdeploy's rewriters look up the calling rewrite with mmrepa's frame_func (rewriters,
    point 6), which returns what mmdeploy's own inspect.stack() search returns."""
    from mmdeploy.core.rewriters import function_rewriter, rewriter_utils, symbolic_rewriter

    from mmrepa.integrations.mmdeploy.rewriters import frame_func

    assert function_rewriter.get_frame_func is symbolic_rewriter.get_frame_func is frame_func
    for top, expected in ((1, _one_up), (2, _two_up)):
        assert _two_up(frame_func, top) is expected
        assert _two_up(rewriter_utils.get_frame_func, top) is expected


def test_rewriter_context_puts_every_function_back():
    """In a fresh process the first RewriterContext used to raise KeyError on exit and leave
    its rewrites in place (mmrepa.integrations.mmdeploy.rewriters, point 5)."""
    code = (
        'import torch.nn.functional as F\n'
        'import mmrepa.integrations.mmdeploy\n'
        'from mmdeploy.core import RewriterContext\n'
        'from mmengine.config import Config\n'
        f'cfg = Config.fromfile({osp.join(DEPLOY, CASES["upernet"][1])!r})\n'
        'import torch\n'
        'kept = F.adaptive_avg_pool2d, torch.linspace\n'
        'for _ in range(2):\n'
        '    with RewriterContext(cfg=cfg, backend="onnxruntime", opset=11):\n'
        '        pass\n'
        '    assert (F.adaptive_avg_pool2d, torch.linspace) == kept\n'
        'print("restored")\n'
    )
    proc = subprocess.run(
        [sys.executable, '-c', code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'restored' in proc.stdout


def test_mmrepa_imports_without_mmdeploy():
    code = (
        'import sys; sys.modules["mmdeploy"] = None\n'
        'import mmrepa\n'
        'from mmrepa.errors import DependencyError\n'
        'try:\n    import mmrepa.integrations.mmdeploy\n'
        'except DependencyError as e:\n    print(e)\n'
    )
    proc = subprocess.run(
        [sys.executable, '-c', code],
        cwd='/',
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # one line (optional.require's), naming the package and how to install it
    assert proc.stdout.startswith('mmrepa.integrations.mmdeploy: needs mmdeploy (make install')
    assert proc.stdout.count('\n') == 1 and 'mmdeploy==1.3.1' in proc.stdout, proc.stdout
