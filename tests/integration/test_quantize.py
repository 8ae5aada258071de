"""INT8 post-training quantization (tools/quantize.py, mmrepa.integrations.quantize) on a demo
detector trained for two iterations on a tiny generated set, and the quantization-aware fold."""

import copy
import importlib.util
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

from mmrepa import reparameterize
from mmrepa.apis import init_model, load_config
from mmrepa.backbones import RePaSwin, RepOptVGG
from mmrepa.integrations.onnx import export_onnx
from mmrepa.layers import ChannelIdleFFN
from tests.helpers import (
    DEMO,
    ROOT,
    TINY_ARCH,
    parse_options,
    randomize_,
    run_script_here,
    script_module,
    shapes_cfg_options,
)

pytest.importorskip('onnxruntime')
onnx = pytest.importorskip('onnx')
quantize = pytest.importorskip('mmrepa.integrations.quantize')


@pytest.fixture(scope='module')
def trained(tmp_path_factory, demo_detector):
    """(root, cfg options for the tiny 64 px set, checkpoint after two training iterations)."""
    data, checkpoints = demo_detector
    options = shapes_cfg_options(data) + [  # 64 px in, as the images (the config resizes)
        'train_dataloader.batch_size=4',
        'train_dataloader.dataset.pipeline.2.scale=(64,64)',
        'val_dataloader.dataset.pipeline.1.scale=(64,64)',
        'test_dataloader.dataset.pipeline.1.scale=(64,64)',
    ]
    return tmp_path_factory.mktemp('quantize'), options, checkpoints[1]


def test_full_detector_int8_report_metric_and_latency(trained, tmp_path, monkeypatch):
    root, options, ckpt = trained
    monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', '0.05')  # a line per 0.05 s of each step
    out, dump = tmp_path / 'det_int8.onnx', tmp_path / 'det.json'
    result, log = run_script_here(
        'tools/quantize.py',
        DEMO,
        ckpt,
        '--full',
        '--report',
        '--calib-images',
        '2',
        '--sqnr-images',
        '2',
        '--repeat',
        '2',
        '--warmup',
        '0',
        '--out',
        out,
        '--dump',
        dump,
        '--cfg-options',
        *options,
    )
    assert result['input_shape'] == [1, 3, 64, 64] and result['form'] == 'identity-apart'
    # outputs: 5 levels of class scores and of box deltas; INT8 close to float32
    assert len(result['sqnr_db_per_output']) == 10
    assert np.isfinite(result['sqnr_db']) and result['sqnr_db'] > 15, result['sqnr_db']
    assert all(np.isfinite(f['sqnr_db']) and f['sqnr_db'] > 15 for f in result['forms'].values()), (
        result['forms']
    )
    # the metric path ran both graphs through mmdet's post-processing and CocoMetric
    assert result['metric_key'] == 'coco/bbox_mAP'
    assert set(result['metric']) == {'float32', 'int8'}
    assert set(result['latency_ms']) == {'float32', 'int8'} and result['speedup'] > 0
    assert 'SQNR of INT8 against float32' in log and 'speed-up' in log
    for running in ('exporting and quantizing the identity-apart full', 'testing the float32 and'):
        assert f'tools/quantize.py: {running}' in log  # the progress lines of two long steps
    # a QDQ graph with one weight scale per output channel, written where asked
    graph = onnx.load(str(out)).graph
    ops = {n.op_type for n in graph.node}
    assert {'QuantizeLinear', 'DequantizeLinear'} <= ops
    assert result['qdq']['per_channel_weights'] > 0
    inits = {i.name: i for i in graph.initializer}
    scales = [
        onnx.numpy_helper.to_array(inits[n.input[1]])
        for n in graph.node
        if n.op_type == 'DequantizeLinear' and n.input[1] in inits
    ]
    assert max(s.size for s in scales) > 1
    # the report: the FFN folds changed their layers (fc1/fc2 -> in_proj/out_proj), the
    # identity shortcut kept apart narrows what the plain fold widened
    ffns = [r for r in result['fold_ranges'] if r['changed'] and r['module'].endswith('.ffn')]
    assert len(ffns) == 5, [r['module'] for r in result['fold_ranges'] if r['changed']]
    for r in ffns:
        assert any(name.endswith('.fc1') for name in r['unfolded']['layers'])
        assert any(name.endswith('.in_proj') for name in r['folded']['layers'])
        assert r['folded']['ratio']['weight_absmax'] > 1
    assert sum(r['identity-apart']['weight_absmax'] for r in ffns) < sum(
        r['folded']['weight_absmax'] for r in ffns
    )
    assert not any(r['changed'] for r in result['fold_ranges'] if '.attn' in r['module'])
    assert 'unfolded / folded / identity-apart' in log and 'stages.0.blocks.0.ffn' in log
    assert osp.exists(dump) and not [p for p in os.listdir(tmp_path) if p.endswith('.tmp')]


def test_backbone_metric_and_a_refused_output(trained, tmp_path):
    root, options, ckpt = trained
    out = tmp_path / 'bb.onnx'
    args = (
        'tools/quantize.py',
        DEMO,
        ckpt,
        '--form',
        'folded',
        '--calib-images',
        '2',
        '--sqnr-images',
        '1',
        '--repeat',
        '0',
        '--out',
        out,
        '--cfg-options',
        *options,
    )
    result, _ = run_script_here(*args)
    assert len(result['sqnr_db_per_output']) == 3 and result['sqnr_db'] > 15
    assert 'coco/bbox_mAP' in result['metric']['int8'] and 'latency_ms' not in result
    log = run_script_here(*args, ok=False)[1]  # the file exists now
    assert 'exists; pass --force' in log


def test_mismatched_calibration_is_refused_and_nothing_is_written(trained, tmp_path):
    root, options, ckpt = trained
    out = tmp_path / 'never.onnx'
    log = run_script_here(
        'tools/quantize.py',
        DEMO,
        ckpt,
        '--shape',
        '96',
        '96',
        '--calib-images',
        '2',
        '--out',
        out,
        '--cfg-options',
        *options,
        ok=False,
    )[1]
    message = log.strip().splitlines()[-1]
    assert message.startswith('tools/quantize.py: train calibration image 0 (')
    assert (
        'has shape (1, 3, 64, 64) but the model was exported for input (1, 3, 96, 96)' in message
        and 'traced for one input shape' in message
    )
    assert os.listdir(tmp_path) == []


@pytest.fixture
def inputs_of_shape(monkeypatch):
    """``set(train=(H, W), test=(H, W))``: tools/quantize.py then reads its calibration
    (train) and test images of these sizes (the test pipeline's images, resized), and every
    export it makes is recorded in the returned list as (input shape, ONNX file)."""

    tool = script_module('tools/quantize.py')
    sizes, exports = {}, []
    real_inputs, real_export = tool.pipeline_inputs, tool.export

    def pipeline_inputs(cfg, preprocessor, num, split='train', seed=0):
        found = real_inputs(cfg, preprocessor, num, split, seed)
        if split not in sizes:
            return found
        return [
            (
                torch.nn.functional.interpolate(
                    torch.from_numpy(a), size=sizes[split], mode='bilinear'
                ).numpy(),
                source,
            )
            for a, source in found
        ]

    def export(model, full, x, path, what, *args):
        exports.append((tuple(x.shape), path))
        return real_export(model, full, x, path, what, *args)

    monkeypatch.setattr(tool, 'pipeline_inputs', pipeline_inputs)
    monkeypatch.setattr(tool, 'export', export)

    def set_sizes(**kwargs):
        sizes.update(kwargs)
        return exports

    return set_sizes


def quantize_fast(ckpt, options, tmp_path, *args, ok=True):
    """tools/quantize.py on one image, without the metric and the timing; --out and --dump in
    ``tmp_path``."""
    return run_script_here(
        'tools/quantize.py',
        DEMO,
        ckpt,
        '--calib-images',
        '1',
        '--sqnr-images',
        '1',
        '--no-metric',
        '--repeat',
        '0',
        '--out',
        tmp_path / 'model.onnx',
        '--dump',
        tmp_path / 'result.json',
        *args,
        '--cfg-options',
        *options,
        ok=ok,
    )


def test_calibration_of_another_shape_than_shape_is_refused_before_the_export(
    trained, tmp_path, inputs_of_shape
):
    """The test images have --shape, the calibration images not: refused before anything is
    exported (the graph would be traced for the wrong input) or written (an INT8 file
    calibrated on other shapes)."""
    _, options, ckpt = trained
    exports = inputs_of_shape(train=(48, 48))
    log = quantize_fast(ckpt, options, tmp_path, '--shape', '64', '64', ok=False)[1]
    message = log.strip().splitlines()[-1]
    assert message.startswith('tools/quantize.py: train calibration image 0 ('), message
    assert 'has shape (1, 3, 48, 48) but the model was exported for input (1, 3, 64, 64)' in message
    assert exports == [] and os.listdir(tmp_path) == []


# ------------------------------------------------------------------ OpenVINO with NNCF

needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec('openvino') is None or importlib.util.find_spec('nncf') is None,
    reason='needs openvino and nncf (.[openvino])',
)


# two compiled models, freed in the order they were made, then a signal with a Python handler
SIGNAL_AFTER_TWO_PLUGINS = """
import signal, subprocess
import numpy as np, openvino as ov
from openvino import opset13 as ops
from mmrepa.integrations.openvino import compile_model
x = ops.parameter([1, 4], np.float32)
first, second = (compile_model(ov.Model([ops.relu(x)], [x])) for _ in range(2))
del first, second
signal.signal(signal.SIGCHLD, lambda *args: None)  # as torch's DataLoader sets it
subprocess.run(['true'])
print('alive')
"""


@needs_openvino
def test_freed_openvino_models_leave_signal_handling_working():
    """OpenVINO's CPU plug-in sets the thread's alternate signal stack to its own when loaded
    and back when unloaded: two unloaded in the order they were loaded left the thread on
    freed memory, and the next handled signal killed the process (a test worker, after
    tools/quantize.py's float32 and INT8 sessions and a DataLoader's SIGCHLD handler)."""
    proc = subprocess.run(
        [sys.executable, '-c', SIGNAL_AFTER_TWO_PLUGINS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == 'alive', (proc.returncode, proc.stderr)


@needs_openvino
def test_openvino_nncf_int8_with_accuracy_control(trained, tmp_path):
    """The demo RetinaNet's folded backbone through NNCF in OpenVINO: an IR with INT8
    FakeQuantize nodes, close to float32, the test metric with both; accuracy control on (a
    loose limit, met at once: the path, not NNCF's search). The timing is the onnxruntime
    path's (OpenVINOSession has its interface)."""
    _, options, ckpt = trained
    out = tmp_path / 'bb_int8.xml'
    result, log = run_script_here(
        'tools/quantize.py',
        DEMO,
        ckpt,
        '--backend',
        'openvino',
        '--max-drop',
        '1.0',
        '--form',
        'folded',
        '--calib-images',
        '2',
        '--sqnr-images',
        '1',
        '--repeat',
        '0',
        '--out',
        out,
        '--cfg-options',
        *options,
    )
    assert result['backend'] == 'openvino' and result['options']['accuracy_control']
    assert sorted(os.listdir(tmp_path)) == ['bb_int8.bin', 'bb_int8.xml']  # nothing else
    assert result['int8_ops']['fake_quantize'] > 10
    # three feature maps; INT8 close to float32 (an independent check of the file: OpenVINO
    # itself against the PyTorch backbone)
    assert len(result['sqnr_db_per_output']) == 3 and result['sqnr_db'] > 15, result
    assert set(result['metric']) == {'float32', 'int8'} and result['metric_key'] == 'coco/bbox_mAP'
    assert 'SQNR of INT8 against float32' in log
    import openvino as ov

    from mmrepa.integrations.openvino import signal_stack_kept

    with signal_stack_kept():  # this worker goes on to handle signals (see the test above)
        compiled = ov.Core().compile_model(str(out), 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})
    cfg = load_config(DEMO, parse_options(options))
    model = reparameterize(init_model(cfg, ckpt))
    # a test image the tool did not measure on (seed), as the model sees it
    x = torch.from_numpy(quantize.pipeline_inputs(cfg, model.data_preprocessor, 1, 'test', 5)[0][0])
    with torch.no_grad():
        ref = [t.numpy() for t in model.backbone(x)]
    got = list(compiled([x.numpy()]).values())
    assert quantize.sqnr_db(ref, got) > 10  # 2 calibration images; a wrong model gives < 1


@needs_openvino
@pytest.mark.parametrize(
    'args, expected',
    [
        (('--shape', '96', '96', '--out', 'XML'), 'train calibration image 0 ('),
        (('--max-drop', '0.01', '--out', 'XML'), 'it needs --backend openvino and the metric'),
        ((), 'OpenVINO writes IR, name it .xml'),  # --out model.onnx
    ],
)
def test_openvino_bad_input_is_one_line_and_writes_nothing(trained, tmp_path, args, expected):
    _, options, ckpt = trained
    args = ['--backend', 'openvino', *(str(tmp_path / 'm.xml') if a == 'XML' else a for a in args)]
    log = quantize_fast(ckpt, options, tmp_path, *args, ok=False)[1]
    assert log.strip().splitlines()[-1].startswith('tools/quantize.py: ')
    assert expected in log.strip().splitlines()[-1], log
    assert os.listdir(tmp_path) == []


def test_a_backend_not_installed_is_named_in_one_line(trained, tmp_path, monkeypatch):
    _, options, ckpt = trained
    monkeypatch.setitem(sys.modules, 'nncf', None)  # import nncf fails
    out = str(tmp_path / 'model.xml')
    log = quantize_fast(ckpt, options, tmp_path, '--backend', 'openvino', '--out', out, ok=False)[1]
    line = log.strip().splitlines()[-1]
    assert line.startswith('tools/quantize.py: needs nncf (') and '[openvino]' in line, line
    assert os.listdir(tmp_path) == []


def test_test_images_of_another_shape_are_named_as_test_images(trained, tmp_path, inputs_of_shape):
    _, options, ckpt = trained
    exports = inputs_of_shape(test=(48, 48))
    log = quantize_fast(ckpt, options, tmp_path, ok=False)[1]
    message = log.strip().splitlines()[-1]
    assert message.startswith('tools/quantize.py: test image 0 ('), message
    assert 'has shape (1, 3, 48, 48' in message and 'calibration' not in message, message
    assert exports == [] and os.listdir(tmp_path) == []


def test_the_graph_is_exported_for_shape(trained, tmp_path, inputs_of_shape):
    """--shape 96 96 on a pipeline that gives 96 x 96 (the config's own gives 64 x 64)."""
    _, options, ckpt = trained
    exports = inputs_of_shape(train=(96, 96), test=(96, 96))
    result, _ = quantize_fast(ckpt, options, tmp_path, '--shape', '96', '96')
    assert [shape for shape, _ in exports] == [(1, 3, 96, 96)]
    assert result['input_shape'] == [1, 3, 96, 96]
    assert quantize.input_shape(str(tmp_path / 'model.onnx')) == (1, 3, 96, 96)


def test_quantize_qdq_refuses_a_wrong_batch_and_leaves_no_file(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    float_path = str(tmp_path / 'f.onnx')
    export_onnx(model, torch.randn(1, 3, 8, 8), float_path)
    good = [(np.random.randn(1, 3, 8, 8).astype(np.float32), f'img{i}') for i in range(2)]
    bad = good + [(np.zeros((1, 3, 8, 9), np.float32), 'odd.png')]
    with pytest.raises(
        quantize.CalibrationMismatch,
        match=r'batch 2 \(odd.png\) has shape \(1, 3, 8, 9\) but the model '
        r'was exported for input \(1, 3, 8, 8\)',
    ):
        quantize.quantize_qdq(float_path, str(tmp_path / 'q.onnx'), bad)
    # a reader used directly refuses it at the batch, too
    reader = quantize.CalibrationReader(bad, (1, 3, 8, 8))
    assert reader.get_next() is not None and reader.get_next() is not None
    with pytest.raises(quantize.CalibrationMismatch):
        reader.get_next()
    assert sorted(os.listdir(tmp_path)) == ['f.onnx']
    ranges = quantize.quantize_qdq(float_path, str(tmp_path / 'q.onnx'), good)
    rows = quantize.weighted_layers(float_path, ranges)
    assert len(rows) == 1 and rows[0]['op'] == 'Conv' and rows[0]['input_range'] is not None
    assert quantize.qdq_summary(str(tmp_path / 'q.onnx'))['per_channel_weights'] == 1


def test_sqnr():
    ref = [np.array([1.0, -1.0]), np.array([2.0])]
    assert quantize.sqnr_db(ref, ref) == float('inf')
    noisy = [np.array([1.1, -1.0]), np.array([2.0])]
    assert quantize.sqnr_db(ref, noisy) == pytest.approx(10 * np.log10(6 / 0.01))


@pytest.mark.parametrize(
    'build',
    [
        lambda: RepOptVGG(
            arch=dict(depths=(1, 2, 2, 1), widths=(8, 16, 16, 32), stem_width=8),
            mode='repvgg',
            out_indices=(3,),
        ),
        lambda: RePaSwin(arch=TINY_ARCH, window_size=4, idle_ratio=0.75, ffn_norm='BN'),
    ],
)
def test_identity_apart_fold_is_exact_and_keeps_identities_out_of_weights(build):
    model = randomize_(build()).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        plain = reparameterize(copy.deepcopy(model))
        apart = quantize.fold_identity_apart(copy.deepcopy(model))
        exact = copy.deepcopy(model).double()(x.double())
        unfolded_error = [(r.double() - e).abs().max() for r, e in zip(ref, exact)]
        # as tests/unit/backbones/test_prepbn_swin.py's float32 fold: against float64 on the
        # same data, within 4x the unfolded float32 model's own error plus one rounding
        for e, err, a in zip(exact, unfolded_error, apart(x)):
            assert (a.double() - e).abs().max() <= 4 * err + 2.0**-24 * e.abs().max()
    assert all(getattr(m, 'deploy', True) for m in apart.modules())
    # the identity term is out of the weights: the plain fold's weights are the apart ones
    # plus the identity (RepVGG: the identity BN's scale on the kernels' diagonal centre taps;
    # channel-idle FFN: I in in_proj's linear rows)
    checked = 0
    for (name, p), m in zip(plain.named_modules(), apart.modules()):
        if getattr(m, 'identity_scale', None) is not None:
            diff = p.conv.weight - m.conv.weight
            centre = diff[:, :, 1, 1]
            # each fold rounds its float64 kernel to float32 once (u = 2^-24 of each weight),
            # the difference once more: 3u of the larger kernel
            bound = 3 * 2.0**-24 * max(p.conv.weight.abs().max(), m.conv.weight.abs().max())
            assert torch.allclose(
                centre, torch.diag(m.identity_scale.flatten()), rtol=0, atol=float(bound)
            )
            assert diff.abs().sum().item() == pytest.approx(
                centre.diagonal().abs().sum().item(), rel=1e-4
            )
            checked += 1
        elif getattr(m, 'shortcut_apart', False):
            a = m.active_channels
            diff = p.in_proj.weight[a:] - m.in_proj.weight[a:]
            bound = 3 * 2.0**-24 * max(p.in_proj.weight.abs().max(), m.in_proj.weight.abs().max())
            assert torch.allclose(diff, torch.eye(diff.shape[0]), rtol=0, atol=float(bound)), name
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize('fold', ['folded', 'identity-apart'])
def test_every_matrix_of_a_folded_ffn_runs_in_int8(fold, tmp_path):
    """The folded FFN's two paths meet in ONNX as MatMul + Add: a Gemm whose C input is a
    tensor (torch.addmm, what eager runs) has no INT8 kernel and onnxruntime ran out_proj in
    float32 between a Dequantize and a Quantize."""
    ffn = randomize_(ChannelIdleFFN(16, idle_ratio=0.75)).eval()
    folded = (reparameterize if fold == 'folded' else quantize.fold_identity_apart)(ffn)
    assert folded.has_idle_channels and folded.out_proj is not None
    x = torch.randn(1, 50, 16)  # 50 tokens, not a multiple of anything
    float_path, int8_path = str(tmp_path / 'f.onnx'), str(tmp_path / 'q.onnx')
    with torch.no_grad():
        export_onnx(folded, x, float_path)
    graph = onnx.load(float_path).graph
    weights = {i.name for i in graph.initializer}
    gemm_c = [n.input[2] for n in graph.node if n.op_type == 'Gemm' and len(n.input) > 2]
    assert set(gemm_c) <= weights, gemm_c
    assert 'MatMul' in {n.op_type for n in graph.node}
    calib = [
        (np.random.default_rng(i).standard_normal((1, 50, 16)).astype(np.float32), f'x{i}')
        for i in range(4)
    ]
    quantize.quantize_qdq(float_path, int8_path, calib)
    ops = quantize.runtime_op_counts(int8_path)
    assert not {'Gemm', 'MatMul', 'FusedMatMul'} & set(ops), ops  # none left in float32
    assert ops.get('QGemm', 0) + ops.get('QLinearMatMul', 0) == 2, ops  # in_proj, out_proj
