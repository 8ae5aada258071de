"""Whole models through mmdeploy 1.3.1: RetinaNet, Mask R-CNN and UperNet with folded mmrepa
backbones export to ONNX (tools/deploy.py, configs/deploy/) and ONNX Runtime gives PyTorch's
boxes, labels, masks and class maps; what cannot be exported is refused without leaving files.

Tiny demo models (configs/demo, random weights with non-trivial BatchNorm statistics) on small
generated data. The detectors are traced at 96 x 96, so the window attention pads (the last
stages' 6 x 6 and 3 x 3 maps against windows of 4) and shifts; the UperNet at 48 x 48, where
its pyramid pooling takes a 2 x 2 map to 3 x 3 and 6 x 6."""

import argparse
import ast
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import DictAction
from torch.nn.modules.batchnorm import _BatchNorm

pytest.importorskip('onnxruntime')
pytest.importorskip('mmdeploy')

import mmrepa  # noqa: E402
import mmrepa.integrations.mmdeploy  # noqa: E402
from mmrepa.apis import init_model  # noqa: E402
from mmrepa.datasets import make_shapes_ade20k, make_shapes_coco  # noqa: E402
from tests.helpers import ROOT, run_script_here, shapes_cfg_options  # noqa: E402

DEMO = osp.join(ROOT, 'configs', 'demo')
DEPLOY = osp.join(ROOT, 'configs', 'deploy')
TOOL = 'tools/deploy.py'


def parse_options(options):
    """``--cfg-options`` as mmengine's DictAction reads them."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options


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


@pytest.mark.parametrize('name', list(CASES))
def test_whole_model_exports_and_onnxruntime_equals_pytorch(name, data, tmp_path):
    root, coco, ade = data
    config, deploy_cfg = (osp.join(DEMO, CASES[name][0]), osp.join(DEPLOY, CASES[name][1]))
    options = upernet_options(ade) if name == 'upernet' else detector_options(coco)
    ckpt = random_checkpoint(config, options, str(tmp_path / 'model.pth'))
    out = tmp_path / 'out'
    # RetinaNet exports the config's first test image (the default); the others a given one
    image = (
        []
        if name == 'retinanet'
        else [
            '--image',
            (
                osp.join(ade, 'images', 'validation', 'shapes_validation_00001.jpg')
                if name == 'upernet'
                else osp.join(coco, 'val', '00001.png')
            ),
        ]
    )
    report, log = run_script_here(
        TOOL, config, ckpt, deploy_cfg, '--out', out, *image, '--cfg-options', *options
    )
    assert sorted(os.listdir(out)) == [
        'deploy_cfg.py',
        'end2end.onnx',
        'folded.pth',
        'model_cfg.py',
        'report.json',
    ]
    with open(out / 'report.json') as f:
        assert json.load(f) == report
    assert report['folded'] and report['params_after'] < report['params_before']
    result = report['onnxruntime_vs_pytorch']
    if name == 'upernet':
        assert report['input_shape'] == [48, 48]
        assert result['differing_pixels'] == 0 and result['pixels'] == 48 * 48
    else:
        assert report['input_shape'] == [96, 96]
        assert result['num_pytorch'] == result['num_onnxruntime'] > 0
        assert result['labels_equal']
        assert result['max_box_diff'] < 1e-3 and result['max_score_diff'] < 1e-4
        if name == 'mask-rcnn':
            assert result['min_mask_iou'] > 0.99
    assert 'onnxruntime vs PyTorch' in log
    # nothing left beside the output but the checkpoint
    assert sorted(os.listdir(tmp_path)) == ['model.pth', 'out']


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
