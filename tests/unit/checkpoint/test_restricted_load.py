"""Release checkpoints of the original projects load under safe loading, through every path;
nothing outside the allow-list is ever called."""

import argparse
import os.path as osp
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import load_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader
from PIL import Image
from yacs.config import CfgNode

from mmrepa.backbones import RePaSwin
from mmrepa.checkpoint import (
    CheckpointError,
    ForeignConfig,
    ForeignGlobalError,
    ForeignNamespace,
    read_state_dict,
)
from tests.helpers import TINY_ARCH


def weights(scale=1.0):
    torch.manual_seed(0)
    model = RePaSwin(TINY_ARCH, window_size=3)
    return {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}


def yacs_config():
    cfg = CfgNode()
    cfg.MODEL = CfgNode(dict(TYPE='swin', DROP_PATH_RATE=0.1))
    cfg.TRAIN = CfgNode(dict(EPOCHS=300, BASE_LR=5e-4))
    cfg.freeze()
    return cfg


def args():
    return argparse.Namespace(model='repavit_swin_base', lr=4e-3, batch_size=256, epochs=300)


def history():
    buffer = HistoryBuffer()
    buffer.update(0.5)
    return buffer


# Each project's layout as its training script writes it.
LAYOUTS = {
    'repavit': lambda: dict(
        model=weights(),
        model_ema=weights(2.0),
        optimizer={},
        lr_scheduler=dict(last_epoch=3),
        epoch=3,
        scaler={},
        args=args(),
    ),
    'slab': lambda: dict(
        model=weights(),
        optimizer={},
        lr_scheduler={},
        max_accuracy=81.2,
        epoch=299,
        config=yacs_config(),
    ),
    'swin': lambda: dict(
        model=weights(),
        optimizer={},
        lr_scheduler={},
        max_accuracy=81.2,
        epoch=299,
        config=yacs_config(),
    ),
    'timm_train': lambda: dict(
        epoch=299,
        arch='caformer_s18',
        state_dict=weights(),
        state_dict_ema=weights(2.0),
        optimizer={},
        version=2,
        args=args(),
        metric=83.6,
    ),
    'mmengine': lambda: dict(
        state_dict=weights(),
        meta=dict(epoch=12, seed=0),
        message_hub=dict(log_scalars=dict(loss=history())),
    ),
}


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('layouts')
    out = {}
    for name, build in LAYOUTS.items():
        out[name] = str(root / f'{name}.pth')
        torch.save(build(), out[name])
    return out


@pytest.mark.parametrize('layout', LAYOUTS)
def test_every_layout_loads_through_init_cfg(files, layout):
    model = RePaSwin(
        TINY_ARCH, window_size=3, init_cfg=dict(type='Pretrained', checkpoint=files[layout])
    )
    model.init_weights()
    expected = weights()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize('layout', ['repavit', 'timm_train'])
def test_ema_weights_on_request(files, layout):
    model = RePaSwin(
        TINY_ARCH,
        window_size=3,
        init_cfg=dict(type='Pretrained', checkpoint=files[layout], use_ema=True),
    )
    model.init_weights()
    key = 'stages.0.blocks.0.ffn.fc1.weight'
    torch.testing.assert_close(model.state_dict()[key], weights(2.0)[key])
    with pytest.raises(KeyError, match='no EMA weights'):
        read_state_dict(files['slab'], use_ema=True)


@pytest.mark.parametrize('layout', LAYOUTS)
def test_every_layout_reads_through_mmengines_loader(files, layout):
    """``load_from``, resume, ``tools/test.py`` and ``tools/reparameterize.py`` all read
    through mmengine's ``CheckpointLoader``: foreign objects come back as inert data."""
    ckpt = CheckpointLoader.load_checkpoint(files[layout], map_location='cpu')
    if 'args' in ckpt:
        assert isinstance(ckpt['args'], ForeignNamespace) and ckpt['args'].epochs == 300
    if 'config' in ckpt:
        assert isinstance(ckpt['config'], ForeignConfig)
        assert ckpt['config'].MODEL.TYPE == 'swin' and ckpt['config']['TRAIN']['EPOCHS'] == 300


def test_load_from_and_the_tools_read_a_checkpoint_carrying_foreign_objects(tmp_path):
    """A detector checkpoint whose meta carries the training arguments (a common habit),
    through mmengine's ``load_checkpoint``, which load_from, tools/test.py and
    tools/reparameterize.py (``mmrepa.apis.init_model``) call."""
    state = {f'backbone.{k}': v for k, v in weights().items()}
    path = str(tmp_path / 'detector.pth')
    torch.save(dict(state_dict=state, meta=dict(args=args(), config=yacs_config())), path)
    detector = torch.nn.Module()
    detector.backbone = RePaSwin(TINY_ARCH, window_size=3)
    load_checkpoint(detector, path, strict=True)  # load_from / tools/test.py
    assert all(torch.equal(v, state[k]) for k, v in detector.state_dict().items())


def test_a_hostile_pickle_is_refused_and_never_runs(tmp_path):
    victim = tmp_path / 'created_by_the_checkpoint'

    class Hostile:
        def __reduce__(self):
            return (open, (str(victim), 'w'))

    path = str(tmp_path / 'hostile.pth')
    torch.save(dict(model=weights(), payload=Hostile()), path)
    for read in (read_state_dict, lambda p: CheckpointLoader.load_checkpoint(p)):
        with pytest.raises(
            ForeignGlobalError,
            match=r'hostile\.pth contains io\.open, '
            'which mmrepa does not load',
        ):
            read(path)
    assert not victim.exists()


def test_unlisted_foreign_classes_are_named(tmp_path):
    path = str(tmp_path / 'other.pth')
    torch.save(dict(model=weights(), extra=argparse.ArgumentParser), path)
    with pytest.raises(ForeignGlobalError, match='argparse.ArgumentParser'):
        read_state_dict(path)


def test_bad_files_stop_with_one_line_naming_the_file(tmp_path, files):
    with pytest.raises(FileNotFoundError, match=r'missing\.pth does not exist'):
        read_state_dict(str(tmp_path / 'missing.pth'))
    truncated = tmp_path / 'truncated.pth'
    data = open(files['mmengine'], 'rb').read()
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / 'notes.pth'
    text.write_text('these are not weights\n')
    for path in (truncated, text):
        with pytest.raises(
            CheckpointError,
            match=rf'{osp.basename(path)} is not a readable '
            'PyTorch checkpoint',
        ) as err:
            read_state_dict(str(path))
        assert '\n' not in str(err.value)


def test_a_file_of_another_kind_is_named_without_the_trusted_file_advice(tmp_path):
    """An export, an image, JSON or a plain pickle handed over as a checkpoint: the message
    says what the file is; loading it with weights_only=False would not help."""
    (tmp_path / 'end2end.xml').write_text('<?xml version="1.0"?>\n<net name="m"></net>\n')
    (tmp_path / 'end2end.bin').write_bytes(np.arange(64, dtype=np.float32).tobytes())
    (tmp_path / 'end2end.onnx').write_bytes(b'\x08\x07\x12\x07pytorch')
    (tmp_path / 'metrics.json').write_text('{"coco/bbox_mAP": 0.5}\n')
    Image.new('RGB', (4, 4)).save(tmp_path / 'image.pth', format='PNG')
    with open(tmp_path / 'results.pkl', 'wb') as f:
        pickle.dump([{'labels': [1, 2]}], f, protocol=4)
    kinds = {
        'end2end.bin': 'the weights of the OpenVINO model end2end.xml',
        'end2end.onnx': 'an ONNX model',
        'metrics.json': 'a JSON file',
        'image.pth': 'a PNG image',
        'results.pkl': "a pickle that torch.save did not write (such as tools/test.py --out's)",
    }
    for name, kind in kinds.items():
        with pytest.raises(CheckpointError) as err:
            read_state_dict(str(tmp_path / name))
        assert str(err.value) == (
            f'{tmp_path / name} is {kind}, not a PyTorch checkpoint: give the .pth file that '
            'tools/train.py or tools/reparameterize.py wrote'
        )
