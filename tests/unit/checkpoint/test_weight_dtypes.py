"""Bool, integer and complex tensors do not load into floating-point weights (torch's copy_
casts them silently: a layer of 0/1, whole numbers, real parts); float16 / bfloat16 ones are
converted and the log says so (issue 39, finding 4)."""

import logging
import os.path as osp

import pytest
import torch
from mmengine.logging import MMLogger

from mmrepa.apis import init_model
from mmrepa.backbones import RePaSwin
from mmrepa.checkpoint.loading import load_state_dict_checked
from mmrepa.datasets import make_shapes_classification
from mmrepa.errors import CheckpointError
from tests.helpers import ROOT, TINY_ARCH, run_script_here

CLASSIFIER = osp.join(ROOT, 'configs', 'demo', 'classifier_repa_caformer_shapes.py')
KEY = 'backbone.stem.conv.weight'


@pytest.fixture(scope='module')
def state():
    return init_model(CLASSIFIER).state_dict()


def saved(state, tmp_path, dtype):
    path = str(tmp_path / f'{dtype}.pth'.replace('torch.', ''))
    changed = dict(state, **{KEY: state[KEY].to(dtype)})
    torch.save(dict(state_dict=changed), path)
    return path


@pytest.mark.parametrize('dtype', [torch.bool, torch.int64, torch.complex64])
def test_a_weight_of_another_kind_is_refused(state, tmp_path, dtype):
    path = saved(state, tmp_path, dtype)
    with pytest.raises(CheckpointError) as err:
        init_model(CLASSIFIER, path)
    assert str(err.value).startswith(  # the backbone's check, before anything is built
        f'{path} (checkpoint): {KEY} is {dtype} in the checkpoint but torch.float32 in the model; '
    )
    # beyond the backbone (a head), the load itself refuses it
    head = 'head.fc.weight'
    torch.save(dict(state_dict=dict(state, **{head: state[head].to(dtype)})), path)
    with pytest.raises(CheckpointError, match=f'{path}: {head} is {dtype} in the checkpoint'):
        init_model(CLASSIFIER, path)
    # the tools' Runner refuses it on its load too (after the Runner's print-out: only the
    # backbone is checked before it), in the last line
    data = make_shapes_classification(str(tmp_path / 'cls'), num_train=3, num_val=3)
    options = [
        f'{loader}.dataset.data_root={data}' for loader in ('val_dataloader', 'test_dataloader')
    ]
    _, log = run_script_here('tools/test.py', CLASSIFIER, path, '--cfg-options', *options, ok=False)
    assert f'{head} is {dtype} in the checkpoint' in log.strip().splitlines()[-1], log[-2000:]


def test_a_half_precision_weight_is_converted_and_said(state, tmp_path):
    path = saved(state, tmp_path, torch.bfloat16)
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        model = init_model(CLASSIFIER, path)
    finally:
        logger.removeHandler(handler)
    assert model.state_dict()[KEY].dtype == torch.float32
    assert torch.equal(model.state_dict()[KEY], state[KEY].to(torch.bfloat16).float())
    assert f"{path}: 1 tensor(s) in torch.bfloat16 converted to the model's precision" in logged


def test_pretrained_backbone_weights_are_checked_too():
    backbone = RePaSwin(arch=TINY_ARCH, window_size=4)
    weights = dict(backbone.state_dict())
    weights['patch_embed.projection.weight'] = weights['patch_embed.projection.weight'].long()
    with pytest.raises(CheckpointError, match='patch_embed.projection.weight is torch.int64'):
        load_state_dict_checked(backbone, weights, source='pretrained.pth')
