"""The command-line tools on generated data: each tool's command line run as a user runs it (a
subprocess), the rest of a tool's checks in this process (``run_script_here``: the same
``main()``, without the interpreter start and imports each subprocess pays)."""

import copy
import json
import os.path as osp
import re

import pytest
import torch

from tests.helpers import DEMO, ROOT, run_script_here, run_tool, shapes_cfg_options

# module-scoped fixtures: keep this file's tests on one xdist worker


@pytest.fixture(scope='module')
def trained(tmp_path_factory, demo_detector):
    """(work dir, cfg options for the small data, checkpoint of 1 epoch of training)."""
    data, checkpoints = demo_detector
    return tmp_path_factory.mktemp('tools'), shapes_cfg_options(data), checkpoints[1]


def verify_error(log):
    """The largest relative error ReparameterizeHook measured between the original and the
    folded model's outputs (it raises above its tolerance; this is the value it logged)."""
    errors = [float(e) for e in re.findall(r'max relative error (\S+)', log)]
    assert errors, log[-4000:]
    return max(errors)


def test_test_with_and_without_reparam(trained):
    root, options, ckpt = trained
    metrics = {}
    # the folded run at the command line (its log is checked), the plain one in this process
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '2'])):
        out = str(root / f'{name}.json')
        args = (
            'tools/test.py',
            DEMO,
            ckpt,
            '--work-dir',
            str(root / 'test'),
            '--dump-metrics',
            out,
            *flags,
            '--cfg-options',
            *options,
        )
        log = run_tool(*args) if flags else run_script_here(*args)[1]
        with open(out) as f:
            metrics[name] = json.load(f)
    assert 'coco/bbox_mAP' in metrics['plain']
    assert metrics['folded'].keys() == metrics['plain'].keys()
    assert verify_error(log) < 1e-4  # the folded model that was tested
    assert 'test_step ms / image' in log and 'parameters (M)' in log  # the latency table


def tensor_outputs(model, batch):
    """Every tensor of the model's tensor-mode outputs (a detector's head outputs)."""
    with torch.no_grad():
        out = model(**model.data_preprocessor(copy.deepcopy(batch), False), mode='tensor')
    flat, todo = [], [out]
    while todo:
        x = todo.pop(0)
        if isinstance(x, torch.Tensor):
            flat.append(x)
        else:
            todo[:0] = list(x)
    return flat


def test_offline_reparameterize_round_trip(trained):
    from mmdet.apis import init_detector

    from mmrepa.apis import init_model
    from mmrepa.integrations.cli.batches import pipeline_batch

    root, options, ckpt = trained
    out = str(root / 'folded.pth')
    before = osp.getmtime(ckpt)
    log = run_tool('tools/reparameterize.py', DEMO, ckpt, out)
    assert 'model.backbone.deploy=True' in log
    assert osp.getmtime(ckpt) == before
    folded = torch.load(out, map_location='cpu')
    source = torch.load(ckpt, map_location='cpu')
    assert folded['meta']['mmrepa']['deploy'] is True
    assert folded['meta']['dataset_meta'] == source['meta']['dataset_meta']
    assert not any('.ffn.fc1.' in k for k in folded['state_dict'])
    # the refusals and --force in this process (the same main() and SystemExit messages)
    assert 'exists' in run_script_here('tools/reparameterize.py', DEMO, ckpt, out, ok=False)[1]
    assert (
        'input checkpoint'
        in run_script_here('tools/reparameterize.py', DEMO, ckpt, ckpt, '--force', ok=False)[1]
    )
    run_script_here('tools/reparameterize.py', DEMO, ckpt, out, '--force')
    # mmdet's loader reads the class names from the checkpoint (COCO's 80 without them)
    deployed = init_detector(DEMO, out, device='cpu', cfg_options={'model.backbone.deploy': True})
    assert deployed.dataset_meta['classes'] == ('circle', 'square', 'triangle')
    # the folded checkpoint computes what the original does: every head output
    original = init_model(DEMO, ckpt)
    batch = pipeline_batch(original.cfg, (64, 96))
    ref, got = tensor_outputs(original, batch), tensor_outputs(deployed, batch)
    assert len(ref) == len(got) == 10  # classes and boxes at 5 levels
    for r, o in zip(ref, got):
        assert r.shape == o.shape
        assert (r - o).abs().max() <= 1e-4 * r.abs().max()


def test_benchmark_summarizes_per_image():
    """tools/benchmark.py's per-image statistics, from known per-call times."""
    import importlib.util

    from mmrepa.utils.latency import LatencyStats

    spec = importlib.util.spec_from_file_location(
        'benchmark_tool', osp.join(ROOT, 'tools', 'benchmark.py')
    )
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    out = benchmark.summarize(dict(a=LatencyStats.of([30.0, 10.0, 20.0])), images=2)
    assert out['a'] == dict(median_ms=10.0, min_ms=5.0, max_ms=15.0, images_per_s=100.0)


def test_benchmark_writes_well_formed_json(trained, tmp_path):
    root, options, ckpt = trained
    out, png = str(tmp_path / 'bench.json'), str(tmp_path / 'bench.png')
    log = run_tool(
        'tools/benchmark.py',
        DEMO,
        '--checkpoint',
        ckpt,
        '--shape',
        '64',
        '96',
        '--repeat',
        '2',
        '--warmup',
        '1',
        '--device',
        'cpu',
        '--out',
        out,
        '--plot',
        png,
        '--onnx',
    )
    assert 'speed-up' in log
    result = json.load(open(out))
    assert result['shape'] == [64, 96] and result['device'] == 'cpu'
    assert set(result['scopes']) == {'backbone', 'test_step'}

    def check_timing(t):  # 2 timed rounds: the median is their mean
        assert t['min_ms'] > 0
        assert t['median_ms'] == pytest.approx((t['min_ms'] + t['max_ms']) / 2)
        assert t['images_per_s'] == pytest.approx(1e3 / t['median_ms'])

    for scope in result['scopes'].values():
        for when in ('before', 'after'):
            check_timing(scope[when])
        assert scope['speedup'] == pytest.approx(
            scope['before']['median_ms'] / scope['after']['median_ms']
        )
        assert scope['params_after'] < scope['params_before']
        assert scope['gmacs_after'] < scope['gmacs_before']
        assert scope['gmacs_ratio'] == pytest.approx(scope['gmacs_before'] / scope['gmacs_after'])
    check_timing(result['scopes']['backbone']['onnx'])  # the folded backbone in onnxruntime
    assert 'onnx' not in result['scopes']['test_step']
    assert osp.getsize(png) > 0


def test_export_onnx_backbone_and_single_stage_detector(trained, tmp_path):
    root, options, ckpt = trained
    # the backbone at the command line, the rest in this process
    for flags, what in (([], 'backbone'), (['--full'], 'model')):
        out = str(tmp_path / f'{what}.onnx')
        args = ('tools/export_onnx.py', DEMO, ckpt, '--shape', '61', '93', '--out', out, *flags)
        log = run_script_here(*args)[1] if flags else run_tool(*args)
        err = float(log.split('max abs difference')[-1].split()[0])
        assert err < 1e-4 and osp.getsize(out) > 0, log
    mask_rcnn = osp.join(ROOT, 'configs', 'repa_swin', 'mask-rcnn_repa_swin_t_1x_coco.py')
    log = run_script_here(
        'tools/export_onnx.py',
        mask_rcnn,
        '--shape',
        '64',
        '64',
        '--full',
        '--out',
        str(tmp_path / 'm.onnx'),
        ok=False,
    )[1]
    assert 'drop --full' in log and 'MaskRCNN' in log


def test_get_flops(trained):
    # in this process; tools/get_flops.py at the command line: test_model_index.py
    log = run_script_here('tools/get_flops.py', DEMO, '--shape', '64', '96')[1]
    assert 'backbone' in log and 'GMACs' in log


# a small RePa-Swin through mmdet's SwinTransformer arguments (the configs name arch='tiny')
SMALL_BACKBONE = [
    'model.backbone.arch=None',
    'model.backbone.embed_dims=16',
    'model.backbone.depths=[1,1,1,1]',
    'model.backbone.num_heads=[1,1,2,2]',
    'model.backbone.init_cfg=None',
]
# a two-stage detector (its RPN needs the image metas) and a segmentor, on small test images;
# 50 proposals, not 1000 (the box and mask heads on 1000 proposals were most of the time)
SMALL_TEST_IMAGES = {
    'repa_swin/mask-rcnn_repa_swin_t_1x_coco.py': [
        'test_dataloader.dataset.pipeline.1.scale=(128,96)',
        *SMALL_BACKBONE,
        'model.neck.in_channels=[16,32,64,128]',
        'model.test_cfg.rpn.nms_pre=100',
        'model.test_cfg.rpn.max_per_img=50',
    ],
    'repa_swin/upernet_repa_swin_t_512x512_160k_ade20k.py': [
        'test_dataloader.dataset.pipeline.1.scale=(128,96)',
        *SMALL_BACKBONE,
        'model.decode_head.in_channels=[16,32,64,128]',
        'model.decode_head.channels=32',
        'model.auxiliary_head.in_channels=64',
        'model.auxiliary_head.channels=16',
    ],
}


@pytest.mark.parametrize('config', sorted(SMALL_TEST_IMAGES))
def test_benchmark_and_get_flops_cover_two_stage_detectors_and_segmentors(config, tmp_path):
    config, small = osp.join(ROOT, 'configs', config), SMALL_TEST_IMAGES[config]
    out = str(tmp_path / 'bench.json')
    # both tools in this process (their command lines: test_benchmark_writes_well_formed_json,
    # test_model_index.py)
    run_script_here(
        'tools/benchmark.py',
        config,
        '--shape',
        '96',
        '128',
        '--repeat',
        '1',
        '--warmup',
        '0',
        '--out',
        out,
        '--cfg-options',
        *small,
    )
    scope = json.load(open(out))['scopes']['test_step']
    assert scope['input_shape'][2:] == [96, 128]
    assert 0 < scope['gmacs_after'] < scope['gmacs_before']
    log = run_script_here(
        'tools/get_flops.py', config, '--shape', '96', '128', '--cfg-options', *small
    )[1]
    model = next(line for line in log.splitlines() if line.startswith('model'))
    params_before, params_after, gmacs_before, gmacs_after = map(float, model.split()[1:5])
    assert params_after < params_before and 0 < gmacs_after <= gmacs_before, log
    backbone = next(line for line in log.splitlines() if line.startswith('backbone'))
    assert float(backbone.split()[5]) > 1.1, log  # the GMACs ratio, unrounded


@pytest.fixture(scope='module')
def ade_like(tmp_path_factory):
    """Two images in ADE20K's layout (jpg images, png label maps 0..150 with 0 = ignore)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp('ade')
    rng = np.random.default_rng(0)
    for split in ('training', 'validation'):
        (root / 'images' / split).mkdir(parents=True)
        (root / 'annotations' / split).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
                root / 'images' / split / f'ADE_{i}.jpg'
            )
            Image.fromarray(rng.integers(0, 151, (48, 64), dtype=np.uint8)).save(
                root / 'annotations' / split / f'ADE_{i}.png'
            )
    return str(root)


def test_train_and_test_an_mmseg_config(ade_like, tmp_path):
    config = osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')
    # small images and widths keep it quick; BN for SyncBN (one process); otherwise the real
    # config
    options = [
        *SMALL_TEST_IMAGES['repa_swin/upernet_repa_swin_t_512x512_160k_ade20k.py'][1:],
        'model.data_preprocessor.size=(64,64)',
        'model.decode_head.norm_cfg.type=BN',
        'model.auxiliary_head.norm_cfg.type=BN',
        'train_dataloader.dataset.pipeline.2.scale=(128,64)',
        'train_dataloader.dataset.pipeline.3.crop_size=(64,64)',
        'test_dataloader.dataset.pipeline.1.scale=(64,64)',
        'train_cfg.max_iters=2',
        'train_cfg.val_interval=2',
        'default_hooks.checkpoint.interval=2',
        'train_dataloader.batch_size=2',
    ]
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [
            f'{loader}.dataset.data_root={ade_like}',
            f'{loader}.num_workers=0',
            f'{loader}.persistent_workers=False',
        ]
    work = str(tmp_path / 'work')
    # all in this process (the runner's log captured); tools/test.py --reparam at the command
    # line: test_test_with_and_without_reparam
    run_script_here('tools/train.py', config, '--work-dir', work, '--cfg-options', *options)
    metrics = {}
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '1'])):
        dump = str(tmp_path / f'{name}.json')
        args = (
            'tools/test.py',
            config,
            osp.join(work, 'iter_2.pth'),
            '--work-dir',
            work,
            '--dump-metrics',
            dump,
            *flags,
            '--cfg-options',
            *options,
        )
        log = run_script_here(*args)[1]
        metrics[name] = json.load(open(dump))
    assert 'mIoU' in metrics['plain']
    assert metrics['folded'].keys() == metrics['plain'].keys()
    assert verify_error(log) < 1e-4  # the segmentor's logits, folded vs original


def test_a_foreign_reparameterizable_backbone_is_folded_by_its_own_convention(trained):
    """RetinaNet with mmpretrain's RepVGG-A0: ``--reparam`` folds it with mmpretrain's
    ``switch_to_deploy`` (its ``reparameterize`` only returns tensors) to mmpretrain's count."""
    from mmrepa.apis import init_model

    root, options, _ = trained
    config = osp.join(ROOT, 'configs', 'demo', 'retinanet_repvgg_shapes.py')
    work = str(root / 'repvgg')
    run_script_here(
        'tools/train.py',
        config,
        '--work-dir',
        work,
        '--cfg-options',
        *options,
        'train_cfg.max_epochs=1',
        'train_cfg.val_interval=2',
        'train_dataloader.batch_size=4',
    )
    ckpt = osp.join(work, 'epoch_1.pth')
    theirs = init_model(config, ckpt)
    before = sum(p.numel() for p in theirs.parameters())
    theirs.backbone.switch_to_deploy()
    after = sum(p.numel() for p in theirs.parameters())
    metrics, logs = {}, {}
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '0'])):
        out = str(root / f'repvgg_{name}.json')
        args = (
            'tools/test.py',
            config,
            ckpt,
            '--work-dir',
            work,
            '--dump-metrics',
            out,
            *flags,
            '--cfg-options',
            *options,
        )  # in this process (the runner's log captured); at the command line:
        # test_test_with_and_without_reparam
        logs[name] = run_script_here(*args)[1]
        with open(out) as f:
            metrics[name] = json.load(f)
    log = logs['folded']
    assert verify_error(log) < 1e-4
    assert 'folded 22 x RepVGGBlock' in log
    assert not re.search(r'x RepVGG\b', log)  # the backbone only set its flag: not a fold
    row = re.search(r'parameters \(M\)\s+(\S+)\s+(\S+)', log)
    assert (row.group(1), row.group(2)) == (f'{before / 1e6:.2f}', f'{after / 1e6:.2f}')
    assert after < before - 790_000  # the branches of 22 blocks are gone
    assert metrics['folded']['coco/bbox_mAP'] == metrics['plain']['coco/bbox_mAP']
