"""Inference and pictures: ``init_model(..., reparam=True)`` under mmdet's and mmseg's inference
APIs, ``tools/image_demo.py`` and ``tools/vis_features.py``, on random-weight checkpoints of small
configs (nothing is trained)."""

import os.path as osp
import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn.modules.batchnorm import _BatchNorm

from mmrepa.apis import init_model
from mmrepa.datasets import make_shapes_coco
from tests.helpers import DEMO, ROOT, run_script_here, script_module, tool_process

# the RePa-Swin UperNet config with a tiny backbone and heads, BN for SyncBN, small test images
TINY_UPERNET = f"""
_base_ = {osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')!r}
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=16, depths=(2, 2, 2, 2),
                            num_heads=(1, 2, 2, 4)),
                  drop_path_rate=0.0, init_cfg=None),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=32, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=64, channels=16, norm_cfg=norm_cfg))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
"""
# names the demo checkpoint carries, unlike the config's: the checkpoint's must win
CKPT_META = dict(classes=('disc', 'box', 'wedge'), palette=[(255, 0, 0), (0, 255, 0), (0, 0, 255)])


def random_checkpoint(config, path, meta=None, tune=None):
    """``config``'s model with its own initialisation and every BatchNorm's statistics and
    affine moved off the defaults (folding then has something to fold), saved to ``path``
    with ``meta`` as the runner would (``None``: a checkpoint without meta)."""
    torch.manual_seed(0)  # init_weights draws from it: the same weights whatever ran before
    model = init_model(config)
    model.init_weights()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
        if tune:
            tune(model)
    checkpoint = dict(state_dict=model.state_dict())
    if meta is not None:
        checkpoint['meta'] = dict(dataset_meta=meta)
    torch.save(checkpoint, path)
    return str(path)


def confident_retinanet(model):
    # a freshly initialised RetinaNet scores ~0.01 everywhere: spread the class logits so a
    # few dozen anchors pass 0.3, with distinct scores
    model.bbox_head.retina_cls.weight.mul_(30)
    model.bbox_head.retina_cls.bias.fill_(-1.5)


@pytest.fixture(scope='module')
def image(tmp_path_factory):
    root = make_shapes_coco(
        str(tmp_path_factory.mktemp('shapes')), num_train=1, num_val=1, size=128
    )
    return osp.join(root, 'val', '00000.png')


@pytest.fixture(scope='module')
def det(tmp_path_factory):
    """(config, checkpoint with dataset_meta, the same weights without meta)."""
    root = tmp_path_factory.mktemp('det')
    ckpt = random_checkpoint(DEMO, root / 'det.pth', CKPT_META, confident_retinanet)
    bare = root / 'bare.pth'
    torch.save(dict(state_dict=torch.load(ckpt)['state_dict']), bare)
    return DEMO, ckpt, str(bare)


@pytest.fixture(scope='module')
def seg(tmp_path_factory):
    """(config, checkpoint with ADE20K's dataset_meta)."""
    root = tmp_path_factory.mktemp('seg')
    config = root / 'upernet_tiny.py'
    config.write_text(TINY_UPERNET)
    meta = init_model(str(config)).dataset_meta  # ADE20K's, from the config's data set
    return str(config), random_checkpoint(str(config), root / 'seg.pth', meta)


def read_png(path):
    with Image.open(path) as im:
        assert im.format == 'PNG'
        return np.asarray(im.convert('RGB'))


def assert_same_detections(a, b, tol=1e-4):
    """Every detection of ``a`` has one in ``b`` with the same label and box and score within
    ``tol`` (matched by box, so two near-equal scores may come in either order)."""
    a, b = a.pred_instances, b.pred_instances
    assert len(a) == len(b)
    unmatched = list(range(len(b)))
    for i in range(len(a)):
        gaps = [
            max(
                (a.bboxes[i] - b.bboxes[j]).abs().max().item(),
                abs(a.scores[i].item() - b.scores[j].item()),
            )
            for j in unmatched
        ]
        j = unmatched.pop(int(np.argmin(gaps)))
        assert min(gaps) <= tol and a.labels[i] == b.labels[j], (i, min(gaps))


def assert_same_segmentation(a, b, tol=1e-4):
    """Logits within ``tol`` of their scale; labels equal wherever the top two logits are
    further apart than the fold error (elsewhere either label is the model's answer)."""
    la, lb = a.seg_logits.data, b.seg_logits.data
    assert (la - lb).abs().max() <= tol * la.abs().max()
    top2 = la.topk(2, dim=0).values
    clear = (top2[0] - top2[1]) > tol * la.abs().max()
    assert clear.float().mean() > 0.99
    pa, pb = a.pred_sem_seg.data[0], b.pred_sem_seg.data[0]
    assert torch.equal(pa[clear], pb[clear])


def test_init_model_reparam_folds_and_sets_what_inference_reads(det):
    config, ckpt, bare = det
    model = init_model(config, ckpt, reparam=True)
    assert not model.training and model.backbone.deploy
    assert not any('.ffn.fc1.' in k for k in model.state_dict())  # the FFNs are folded
    assert model.cfg.filename == config
    assert model.dataset_meta['classes'] == CKPT_META['classes']  # not the config's
    assert model.dataset_meta['palette'] == CKPT_META['palette']
    # no meta: the config's test data set, said in a warning
    with pytest.warns(UserWarning, match=r"bare.pth has no dataset_meta .* the config's test"):
        model = init_model(config, bare)
    assert model.dataset_meta['classes'] == ('circle', 'square', 'triangle')
    assert model.dataset_meta['palette'] == [(220, 20, 60), (0, 128, 255), (60, 180, 75)]


def test_folded_detector_predicts_the_same(det, image):
    from mmdet.apis import DetInferencer, inference_detector

    config, ckpt, _ = det
    plain = init_model(config, ckpt)
    folded = init_model(config, ckpt, reparam=True)
    expected = inference_detector(plain, image)
    assert (expected.pred_instances.scores > 0.3).sum() >= 5  # something to compare
    assert_same_detections(expected, inference_detector(folded, image))
    # mmdet's inferencer builds its own model from a config and weights: hand it ours
    inferencer = DetInferencer(config, ckpt, device='cpu', show_progress=False)
    inferencer.model = folded
    got = inferencer(image, return_datasamples=True)['predictions'][0]
    assert_same_detections(expected, got)


def test_folded_segmentor_predicts_the_same(seg, image):
    from mmseg.apis import MMSegInferencer, inference_model

    config, ckpt = seg
    plain = init_model(config, ckpt)
    folded = init_model(config, ckpt, reparam=True)
    assert plain.dataset_meta['classes'][:2] == ('wall', 'building')  # ADE20K's
    expected = inference_model(plain, image)
    assert expected.pred_sem_seg.data.unique().numel() > 1
    assert_same_segmentation(expected, inference_model(folded, image))
    inferencer = MMSegInferencer(config, ckpt, device='cpu')
    inferencer.show_progress = False
    inferencer.model = folded
    assert_same_segmentation(expected, inferencer(image, return_datasamples=True))


def test_image_demo_draws_and_lists_detections(det, image, tmp_path, capsys):
    config, ckpt, _ = det
    out = tmp_path / 'pictures' / 'det.png'  # a directory that does not exist yet
    # its main() in this process (at the command line: test_missing_inputs_are_one_line_each)
    script_module('tools/image_demo.py').main(
        [config, ckpt, image, '--reparam', '--score-thr', '0.3', '--out-file', str(out)]
    )
    stdout = capsys.readouterr().out
    count = int(re.search(r'^(\d+) detection\(s\) with score > 0.3', stdout, re.M).group(1))
    lines = re.findall(r'^(disc|box|wedge) +score (\d\.\d+)  box( +[\d.]+){4}$', stdout, re.M)
    assert count >= 5 and len(lines) == count
    assert all(float(score) > 0.3 for _, score, _ in lines)
    drawn, source = read_png(out), read_png(image)
    assert drawn.shape == source.shape == (128, 128, 3)  # the image, drawn on
    assert (drawn != source).any(axis=-1).mean() > 0.05  # boxes and labels


def test_image_demo_summarizes_segmentation(seg, image, tmp_path, capsys):
    config, ckpt = seg
    out = tmp_path / 'seg.png'
    script_module('tools/image_demo.py').main([config, ckpt, image, '--out-file', str(out)])
    stdout = capsys.readouterr().out
    areas = [float(p) for p in re.findall(r'^\S.*? +(\d+\.\d) %  \(\d+ px\)$', stdout, re.M)]
    assert len(areas) > 1 and sum(areas) == pytest.approx(100, abs=1)
    drawn = read_png(out)
    assert drawn.shape == (128, 128, 3) and (drawn != read_png(image)).any()


@pytest.mark.parametrize('what', ['det', 'seg'])
def test_vis_features_draws_outputs_before_and_after_folding(
    what, det, seg, image, tmp_path, capsys
):
    config, ckpt = (det if what == 'det' else seg)[:2]
    out = tmp_path / 'features.png'
    rows = script_module('tools/vis_features.py').main(
        [config, ckpt, image, '--out-file', str(out)]
    )
    assert len(rows) == (3 if what == 'det' else 4)  # the backbone's out_indices
    assert all(0 < row['rel_diff'] < 1e-5 for row in rows)  # folded, and exactly so
    printed = re.findall(
        r'^output \d .*max abs diff (\S+), relative (\S+)$', capsys.readouterr().out, re.M
    )
    assert [float(r) for _, r in printed] == pytest.approx([r['rel_diff'] for r in rows], rel=1e-3)
    picture = read_png(out)
    assert picture.shape[0] >= 300 * len(rows) and picture.shape[1] >= 1200
    assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 100  # colour maps, not blank


@pytest.mark.parametrize('tool', ['image_demo', 'vis_features'])
def test_missing_inputs_are_one_line_each(tool, det, image, tmp_path):
    config, ckpt, _ = det
    script, out = f'tools/{tool}.py', str(tmp_path / 'x.png')
    proc = tool_process(script, 'no/config.py', 'no/ckpt.pth', 'no/image.png', '--out-file', out)
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert proc.stderr.splitlines() == [
        f'{tool}.py: config not found: no/config.py',
        f'{tool}.py: checkpoint not found: no/ckpt.pth',
        f'{tool}.py: image not found: no/image.png',
    ]
    # in this process (a traceback would raise here); the first run checked the terminal
    _, log = run_script_here(script, config, ckpt, 'no/image.png', '--out-file', out, ok=False)
    assert log.splitlines() == [f'{tool}.py: image not found: no/image.png'], log[-2000:]
    assert not osp.exists(out)
