"""tools/test.py --reparam on checkpoints of the families with folds of their own: a CAFormer
detector (StarReLU scales, res scales) and a DeiT classifier whose branches were joined by the
schedule (λ = 1, and one saved mid-ramp); and the dense configs taking the joined checkpoint."""

import json
import re

import pytest
import torch
from mmengine.config import Config

from tests.helpers import (
    ROOT,
    fresh_mmengine_instances,
    randomize_,
    run_script_here,
    tiny_classifier_config,
    write_images,
)

# ------------------------------------------------------------------------------ MetaFormer


def test_tools_test_reparam_folds_and_verifies_a_caformer_detector(tmp_path):
    import json
    import os.path as osp

    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmrepa.datasets import make_shapes_coco

    root = ROOT
    config = osp.join(root, 'configs', 'demo', 'retinanet_repa_caformer_shapes.py')
    with DefaultScope.overwrite_default_scope('mmdet'):
        detector = DET_MODELS.build(Config.fromfile(config).model)
    randomize_(detector.backbone)  # non-trivial BN statistics, StarReLU and res scales
    ckpt = str(tmp_path / 'caformer.pth')
    torch.save({'state_dict': detector.state_dict(), 'meta': {}}, ckpt)
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=2, size=64) + '/'
    options = [
        f'test_dataloader.dataset.data_root={data}',
        'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False',
        f'test_evaluator.ann_file={data}annotations/val.json',
        'model.test_cfg.score_thr=0.0',
    ]
    metrics = str(tmp_path / 'metrics.json')
    # in this process (its main(), the runner's log captured); tools/test.py --reparam at the
    # command line: test_tools.py::test_test_with_and_without_reparam
    _, log = run_script_here(
        'tools/test.py',
        config,
        ckpt,
        '--reparam',
        '--latency-batches',
        '1',
        '--work-dir',
        str(tmp_path / 'work'),
        '--dump-metrics',
        metrics,
        '--cfg-options',
        *options,
    )
    assert 'folded model verified' in log and 'parameters (M)' in log
    with open(metrics) as f:
        assert 'coco/bbox_mAP' in json.load(f)


# ---------------------------------------------------------------------- DepthRepViT


@pytest.fixture(scope='module')
def joined_classifier(tmp_path_factory):
    """The DeiT-6-R joining config, shrunk (tiny arch, generated images, 4 iterations with λ
    reaching 1 at iteration 2), trained by mmengine's Runner: (config, checkpoint)."""
    from mmengine.runner import Runner

    from mmrepa.apis import load_config

    tmp = tmp_path_factory.mktemp('depthrep')
    config = tiny_classifier_config(
        'depth_rep_vit/depthrep_vit_tiny_d6_8xb128_join_in1k.py',
        dict(embed_dims=16, num_layers=12, num_heads=2),
        write_images(str(tmp / 'data')),
        str(tmp / 'join.py'),
    )
    with open(config, 'a') as f:
        f.write(
            "load_from = None\ncustom_hooks = [dict(type='BranchJoinScheduleHook', "
            'begin_iter=0, end_iter=2)]\n'
        )
    cfg = load_config(config)
    cfg.work_dir = str(tmp / 'work')
    # its logger is dropped with it: a tool run below on the same config, started within the
    # same second, would take it (mmengine names it by config and second) and log elsewhere
    with fresh_mmengine_instances():
        runner = Runner.from_cfg(cfg)
        runner.train()
    assert all(b.current_join_lambda == 1.0 for b in runner.model.backbone.stages)
    return config, str(tmp / 'work' / 'iter_4.pth')


def test_test_tool_verifies_a_joined_checkpoint_and_refuses_one_mid_ramp(
    joined_classifier, tmp_path
):
    """tools/test.py --reparam folds a checkpoint whose λ reached 1 (same top-1, verified) and
    refuses one saved mid-ramp, naming the block and its λ; no metrics are written then."""

    config, checkpoint = joined_classifier
    top1 = {}
    for name, flags in (('plain', []), ('folded', ['--reparam', '--latency-batches', '1'])):
        out = tmp_path / f'{name}.json'
        args = (
            config,
            checkpoint,
            '--work-dir',
            str(tmp_path / name),
            '--dump-metrics',
            str(out),
            *flags,
        )
        # both in this process (the runner's log captured, the hook's line checked); at the
        # command line: test_tools.py::test_test_with_and_without_reparam
        log = run_script_here('tools/test.py', *args)[1]
        top1[name] = json.loads(out.read_text())['accuracy/top1']
    assert 'ReparameterizeHook: folded model verified' in log
    assert top1['folded'] == top1['plain']

    ckpt = torch.load(checkpoint, map_location='cpu', weights_only=False)
    for key in ckpt['state_dict']:
        if key.endswith('join_lambda'):
            ckpt['state_dict'][key].fill_(0.5)
    mid_ramp = tmp_path / 'mid_ramp.pth'
    torch.save(ckpt, mid_ramp)
    out = tmp_path / 'refused.json'
    _, log = run_script_here(
        'tools/test.py',
        config,
        str(mid_ramp),
        '--work-dir',
        str(tmp_path / 'refused'),
        '--reparam',
        '--dump-metrics',
        str(out),
        ok=False,
    )
    assert re.search(r'stages\.0\.attn.*join_lambda = 0\.5', log), log[-2000:]
    assert not out.exists()


def test_the_dense_configs_load_the_joined_classifier(joined_classifier):
    """The hand-off: Mask R-CNN, RetinaNet and UperNet (their backbones, tiny arch) take the
    joining run's checkpoint through init_cfg as it is; the head count comes from its config;
    the branches arrive unchanged, and λ = 1 with them."""
    from mmrepa.apis import build_model

    config, checkpoint = joined_classifier
    classifier = torch.load(checkpoint, map_location='cpu', weights_only=False)['state_dict']
    for name in (
        'depth_rep_vit/mask-rcnn_depthrep_vit_tiny_d6_lsj-100e_coco.py',
        'depth_rep_vit/retinanet_depthrep_vit_tiny_d6_1x_coco.py',
        'depth_rep_vit/upernet_depthrep_vit_tiny_d6_512x512_160k_ade20k.py',
    ):
        cfg = Config.fromfile(f'{ROOT}/configs/{name}')
        cfg.model.backbone.arch = dict(embed_dims=16, num_layers=12, num_heads=2)
        cfg.model.backbone.init_cfg.checkpoint = checkpoint
        backbone = build_model(cfg).backbone
        report = backbone.load_pretrained(checkpoint)
        assert report.unexpected == ['cls_token'], (name, report.unexpected)
        assert not report.missing, (name, report.missing)
        assert torch.equal(
            backbone.stages[5].mlp.branch_fc1.weight,
            classifier['backbone.stages.5.mlp.branch_fc1.weight'],
        )
        assert all(block.current_join_lambda == 1.0 for block in backbone.stages)
