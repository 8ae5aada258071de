"""ReparameterizeHook's parts without a runner: latency on the real clock, verification of a
two-stage detector."""

import copy
import logging
import os.path as osp
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import mmrepa
from mmrepa.apis import init_model
from mmrepa.engine import ReparameterizeHook
from mmrepa.integrations.cli.batches import pipeline_batch
from tests.helpers import ROOT, randomize_


class Sleeps(nn.Module):
    """test_step sleeps ``ms_per_image`` per image of the batch."""

    def __init__(self, ms_per_image):
        super().__init__()
        self.ms_per_image = ms_per_image
        self.weight = nn.Parameter(torch.zeros(1))  # a device to time on

    def test_step(self, batch):
        time.sleep(self.ms_per_image * len(batch['inputs']) / 1e3)
        return [None] * len(batch['inputs'])


def test_latency_is_milliseconds_per_image_of_each_batch():
    hook = ReparameterizeHook(measure_latency=True, warmup=0)
    hook.results = {}
    runner = SimpleNamespace(logger=logging.getLogger('test_hooks_reparameterize'))
    batches = [dict(inputs=[0] * 4), dict(inputs=[0])]  # 4 images, then 1
    hook._measure(runner, Sleeps(20.0), Sleeps(10.0), batches)
    r = hook.results
    # sleeping lasts at least as asked; the upper bounds leave room for a busy machine. Timing
    # each batch by the first batch's size gives (80 + 20) / 2 / 4 = 12.5 ms before, by one
    # image (80 + 20) / 2 = 50 ms
    assert 20.0 <= r['ms_per_image_before'] < 20.0 + 25.0
    assert 10.0 <= r['ms_per_image_after'] < 10.0 + 25.0


class RecordsAutocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.seen = []

    def test_step(self, batch):
        self.seen.append(torch.is_autocast_enabled('cpu'))
        return [None] * len(batch['inputs'])


@pytest.mark.parametrize('fp16', [False, True])
def test_latency_is_timed_under_the_test_loops_autocast(fp16):
    """TestLoop(fp16=True) tests under autocast: the hook times both models so too."""
    hook = ReparameterizeHook(measure_latency=True, warmup=1)
    hook.results = {}
    runner = SimpleNamespace(
        logger=logging.getLogger('test_hooks_reparameterize'), test_loop=SimpleNamespace(fp16=fp16)
    )
    before, after = RecordsAutocast(), RecordsAutocast()
    hook._measure(runner, before, after, [dict(inputs=[0])] * 2)
    assert before.seen == after.seen == [fp16] * 3
    assert hook.results['autocast'] is fp16


class PicksLargest(nn.Module):
    """An 'RPN': dense scores, and the 5 largest as proposals."""

    def forward(self, x):
        return x * 2

    def predict(self, x, data_samples, rescale=False):
        return x.topk(5).indices


class ReadsPicked(nn.Module):
    """A 'RoI head': its output depends on which proposals it gets."""

    def forward(self, x, proposals, data_samples=None):
        return (proposals + 1) * x.gather(1, proposals)


class NearTies(nn.Module):
    """A two-stage detector in miniature whose 100 features differ by 1e-6; ``shift`` changes
    them at the rounding level of a fold (3e-6), enough for the RPN to pick others."""

    with_rpn = True

    def __init__(self, shift=0.0):
        super().__init__()
        self.shift = shift
        self.rpn_head, self.roi_head = PicksLargest(), ReadsPicked()

    def data_preprocessor(self, batch, training):
        return dict(inputs=batch['inputs'], data_samples=None)

    def extract_feat(self, inputs):
        return inputs + self.shift * torch.sin(7.0 * torch.arange(inputs.shape[1]))

    def forward(self, inputs, data_samples=None, mode='tensor'):  # as mmdet's two-stage
        x = self.extract_feat(inputs)
        return self.roi_head(x, self.rpn_head.predict(x, data_samples), data_samples)


def test_verify_gives_both_stages_the_same_proposals():
    """Which proposals an RPN selects is discrete: rounding-level differences pick others (on
    Mask R-CNN at 800 x 1088, tensor-mode RoI outputs then differ by 30-70 %). The RoI heads
    are compared on the original's proposals."""
    torch.manual_seed(0)
    batch = dict(inputs=1 + 1e-6 * torch.randperm(100).float()[None])
    original, folded = NearTies(), NearTies(shift=3e-6)
    hook = ReparameterizeHook()
    runner = SimpleNamespace(logger=logging.getLogger('test_hooks_reparameterize'))
    hook._verify(runner, original, folded, batch)
    assert hook.results['verify_rel_error'] < 1e-4
    # in plain tensor mode the folded model reads other proposals
    a, b = original(**batch), folded(**batch)
    assert ((a - b).abs().max() / a.abs().max()).item() > 0.1


@pytest.fixture(scope='module')
def two_stage():
    """A small Mask R-CNN with random weights and a batch for it."""
    options = {
        'model.backbone.arch': dict(
            _delete_=True, embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2)
        ),
        'model.backbone.init_cfg': None,
        'model.neck.in_channels': [16, 32, 64, 128],
        # narrow heads (mmdet's are 256 wide with a 12544 x 1024 box layer): the path is tested
        'model.neck.out_channels': 32,
        'model.rpn_head.in_channels': 32,
        'model.rpn_head.feat_channels': 32,
        'model.roi_head.bbox_roi_extractor.out_channels': 32,
        'model.roi_head.bbox_head.in_channels': 32,
        'model.roi_head.bbox_head.fc_out_channels': 64,
        'model.roi_head.mask_roi_extractor.out_channels': 32,
        'model.roi_head.mask_head.in_channels': 32,
        'model.roi_head.mask_head.conv_out_channels': 32,
        'model.test_cfg.rpn.nms_pre': 200,
        'model.test_cfg.rpn.max_per_img': 50,
        'test_dataloader.dataset.pipeline.1.scale': (128, 96),
    }
    model = init_model(
        osp.join(ROOT, 'configs', 'repa_swin', 'mask-rcnn_repa_swin_t_1x_coco.py'),
        cfg_options=options,
    )
    randomize_(model.backbone)
    return model, pipeline_batch(model.cfg, (96, 128))


def test_verify_a_two_stage_detector(two_stage):
    """mmdet's Mask R-CNN through the shared-proposals path: the folded copy passes, a wrong
    mask head does not."""
    model, batch = two_stage
    hook = ReparameterizeHook()
    runner = SimpleNamespace(logger=logging.getLogger('test_hooks_reparameterize'))
    hook._verify(runner, model, mmrepa.reparameterize(copy.deepcopy(model)), batch)
    assert hook.results['verify_rel_error'] < 1e-4
    # and a wrong RoI head is still caught
    broken = mmrepa.reparameterize(copy.deepcopy(model))
    with torch.no_grad():
        broken.roi_head.mask_head.conv_logits.bias.add_(1e-2)
    with pytest.raises(RuntimeError, match='folded model disagrees'):
        hook._verify(runner, model, broken, batch)
