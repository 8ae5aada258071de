"""ImageNet pretraining in mmpretrain and the hand-off to detection and segmentation.

A classifier config (``configs/<family>/*_in1k.py``, shrunk to a tiny arch and given a few generated
images) is trained for a few iterations with ``tools/train.py`` (its main(), in this process);
the RetinaNet and UperNet
configs of the same family load its checkpoint through their backbone's ``init_cfg``, with
nothing missing but the output norms, and their backbones compute the classifier's stage
features. The tools take the classifier config as they take mmdet and mmseg ones.
"""

import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmrepa.apis import build_model, init_model, load_config
from mmrepa.errors import CheckpointError, ConfigError
from tests.helpers import (
    ITERS,
    METAFORMER_TINY,
    ROOT,
    TINY_ARCH,
    backbone_outputs,
    own_script,
    run_script_here,
    set_feature_channels,
    tiny_classifier_config,
    write_images,
    written_metrics,
)

# classifier config -> (dense configs that load its checkpoint, tiny arch)
FAMILIES = {
    'repa_swin/repa_swin_t_32xb128_in1k.py': (
        (
            'repa_swin/retinanet_repa_swin_t_1x_coco.py',
            'repa_swin/upernet_repa_swin_t_512x512_160k_ade20k.py',
        ),
        TINY_ARCH,
    ),
    'metaformer/repa_caformer_s18_32xb128_in1k.py': (
        (
            'metaformer/retinanet_repa_caformer_s18_1x_coco.py',
            'metaformer/upernet_repa_caformer_s18_512x512_160k_ade20k.py',
        ),
        METAFORMER_TINY,
    ),
    'prepbn_swin/prepbn_swin_t_8xb128_in1k.py': (
        (
            'prepbn_swin/retinanet_prepbn_swin_t_1x_coco.py',
            'prepbn_swin/upernet_prepbn_swin_t_512x512_160k_ade20k.py',
        ),
        TINY_ARCH,
    ),
}
# the family whose training log test_tools_take_the_classifier_config reads
CLI_FAMILY = 'repa_swin/repa_swin_t_32xb128_in1k.py'


@pytest.fixture(scope='module')
def train(tmp_path_factory):
    """``train(base)``: (classifier config, its checkpoint after ITERS iterations of
    tools/train.py with --auto-scale-lr, base, the training log), once per module and family,
    tools/train.py's main() in this process (without a subprocess's imports)."""
    done = {}

    def trained(base):
        if base not in done:
            tmp = tmp_path_factory.mktemp(osp.basename(base).split('_32xb')[0].split('_8xb')[0])
            data = write_images(str(tmp / 'data'))
            config = tiny_classifier_config(
                base, FAMILIES[base][1], data, str(tmp / 'classifier.py')
            )
            args = ('tools/train.py', config, '--work-dir', str(tmp / 'work'), '--auto-scale-lr')
            log = run_script_here(*args)[1]
            done[base] = config, str(tmp / 'work' / f'iter_{ITERS}.pth'), base, log
        return done[base]

    return trained


@pytest.fixture(params=sorted(FAMILIES))
def trained(request, train):
    return train(request.param)


@pytest.fixture
def trained_repa_swin(train):
    return train(CLI_FAMILY)


def dense_model(config: str, arch: dict, checkpoint: str):
    """The dense config's model with the tiny arch and ``checkpoint`` as its pretrained
    weights (the neck / heads following the tiny backbone's channels)."""
    cfg = Config.fromfile(osp.join(ROOT, 'configs', config))
    cfg.model.backbone.arch = arch
    cfg.model.backbone.init_cfg.checkpoint = checkpoint
    tiny = build_model(cfg).backbone
    set_feature_channels(cfg.model, backbone_outputs(tiny))
    return build_model(cfg)


def stage_features(backbone, x):
    """Every tensor each stage returns (the stage's own output, before any output norm)."""
    found = []
    hooks = [
        stage.register_forward_hook(
            lambda m, i, out: found.extend(
                t for t in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(t)
            )
        )
        for stage in backbone.stages
    ]
    try:
        with torch.no_grad():
            backbone(x)
    finally:
        for h in hooks:
            h.remove()
    return found


def test_dense_configs_load_the_classifier_checkpoint_as_it_is(trained):
    config, checkpoint, base, _ = trained
    classifier = init_model(config, checkpoint).double()
    # a size where classifier and dense backbones compute one function: for Swin every map
    # larger than the window (7; the classifiers' released Swin does not shift a map the window
    # covers, mmdet's does), for CAFormer every map within the dense configs' attention windows
    size = (64, 96) if 'caformer' in base else (256, 288)
    x = torch.randn(1, 3, *size, dtype=torch.float64)
    expected = stage_features(classifier.backbone, x)
    for dense in FAMILIES[base][0]:
        model = dense_model(dense, FAMILIES[base][1], checkpoint)
        model.backbone.init_weights()  # the init_cfg path: raises if a core weight is missing
        report = model.backbone.load_pretrained(checkpoint)
        outputs = {f'norm{i}' for i in model.backbone.out_indices}
        assert {k.split('.')[0] for k in report.missing} <= outputs, (dense, report.missing)
        assert not [k for k in report.unexpected if not k.startswith(('head.', 'norm'))], (
            dense,
            report.unexpected,
        )
        got = stage_features(model.backbone.eval().double(), x)
        assert len(got) == len(expected)
        # both in float64 (u = 2^-53 = 1.1e-16), summing in different orders: a reduction of
        # n <= 10^3 terms errs by gamma_n ~ 1e-13 of the sum of magnitudes (features ~1), and
        # fewer than 100 reductions stand in series; a missing weight moves features by 1e-2
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_classifier_checkpoint_of_another_size_is_refused_by_name(trained):
    config, checkpoint, base, _ = trained
    arch = dict(FAMILIES[base][1])
    key = 'embed_dims' if 'embed_dims' in arch else 'dims'
    arch[key] = arch[key] * 2 if key == 'embed_dims' else tuple(d * 2 for d in arch[key])
    model = dense_model(FAMILIES[base][0][0], arch, checkpoint)
    # the MetaFormers name both archs, the others say it is another one
    with pytest.raises(CheckpointError, match='another arch|the checkpoint is a .* the model a'):
        model.backbone.init_weights()


def test_tools_take_the_classifier_config(trained_repa_swin, tmp_path):
    """tools/train.py --auto-scale-lr, tools/test.py (top-1 unchanged by --reparam),
    mmpretrain's own tools/test.py on the deploy config with a checkpoint folded by
    tools/reparameterize.py (get_flops: test_model_index.py). All in this process (their main(),
    the runner's log captured); tools/test.py --reparam at the command line:
    test_tools.py::test_test_with_and_without_reparam."""
    config, checkpoint, _, train_log = trained_repa_swin
    # the recipe's learning rate is for the paper's 4096 images per step; this run has 4
    assert 'LR is set based on batch size of 4096 and the current batch size is 4' in train_log
    metrics = {}
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '1'])):
        out = str(tmp_path / f'{name}.json')
        args = (
            'tools/test.py',
            config,
            checkpoint,
            '--work-dir',
            str(tmp_path / name),
            '--dump-metrics',
            out,
            *flags,
        )
        log = run_script_here(*args)[1]
        with open(out) as f:
            metrics[name] = json.load(f)
    assert 'ReparameterizeHook: folded model verified' in log
    assert metrics['folded']['accuracy/top1'] == metrics['plain']['accuracy/top1']

    folded = str(tmp_path / 'folded.pth')
    run_script_here('tools/reparameterize.py', config, checkpoint, folded)
    deploy = tmp_path / 'deploy.py'
    deploy.write_text(f'_base_ = {config!r}\nmodel = dict(backbone=dict(deploy=True))\n')
    work = str(tmp_path / 'own')
    run_script_here(own_script('mmpretrain'), str(deploy), folded, '--work-dir', work)
    assert written_metrics(work)['accuracy/top1'] == metrics['plain']['accuracy/top1']


def test_a_classifier_with_several_outputs_is_refused_by_option():
    """Every tool loads configs through load_config, and prints a ConfigError as one line."""
    config = osp.join(ROOT, 'configs', 'repa_swin', 'repa_swin_t_32xb128_in1k.py')
    with pytest.raises(
        ConfigError,
        match=r'model\.backbone\.out_indices=\(0, 1, 2, 3\).*'
        r'set out_indices=\(3, \)',
    ):
        load_config(config, {'model.backbone.out_indices': [0, 1, 2, 3]})
    load_config(config, {'model.backbone.out_indices': [2]})  # one map, any stage: fine
