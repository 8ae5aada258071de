"""A bad option, checkpoint, class list or image stops a tool with a line or two naming it,
before mmengine's Runner prints its environment and config (~540 lines): issue 22, point 4.

Each tool runs in this process (``run_script_here``) up to its error; nothing is trained.
"""

import io
import os.path as osp
import sys

import mmdet
import pytest
import torch

from mmrepa.apis import init_model
from mmrepa.backbones import RePaSwin
from mmrepa.config.explain import TRACEBACK_HINT, explain
from mmrepa.datasets import make_shapes_coco
from mmrepa.seams import _excepthook
from tests.helpers import DEMO, run_script_here, shapes_cfg_options

MMDET_TRAIN = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
MAX_LINES = 2  # the message, and at most one log line (e.g. the checkpoint being read)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """(folder, cfg options for a small shapes set, checkpoints: the demo model's, and one of a
    RePa-Swin with 16 channels instead of 32)."""
    root = tmp_path_factory.mktemp('errors_first')
    data = make_shapes_coco(str(root / 'data'), num_train=2, num_val=2, size=32) + '/'
    model = init_model(DEMO)
    good = str(root / 'good.pth')
    torch.save(
        dict(state_dict=model.state_dict(), meta=dict(dataset_meta=model.dataset_meta)), good
    )
    other = RePaSwin(
        arch=dict(embed_dims=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)),
        window_size=4,
        idle_ratio=0.75,
        ffn_norm='BN',
        out_indices=(1, 2, 3),
    )
    other_path = str(root / 'other_arch.pth')
    torch.save(
        dict(state_dict={f'backbone.{k}': v for k, v in other.state_dict().items()}), other_path
    )
    return root, shapes_cfg_options(data), dict(good=good, other=other_path)


def run_until_error(script, *args):
    """The tool's output (stdout, stderr and its exit message), checked to be short."""
    _, log = run_script_here(script, *args, ok=False)
    lines = log.strip().splitlines()
    assert 1 <= len(lines) <= MAX_LINES, log[-3000:]
    return log


def train_with(setup, *options):
    root, cfg_options, _ = setup
    return run_until_error(
        'tools/train.py',
        DEMO,
        '--work-dir',
        str(root / 'work'),
        '--cfg-options',
        *cfg_options,
        *options,
    )


@pytest.mark.parametrize(
    'option, expected',
    [
        (
            'model.backbone.type=RePaSwn',
            ["model.backbone.type='RePaSwn' is not a registered type", "did you mean 'RePaSwin'?"],
        ),
        ('model.neck.type=mmdet.FPNN', ["model.neck.type='mmdet.FPNN'", "did you mean 'FPN'?"]),
        (
            'model.backbone.arch=huge',
            ["model.backbone (RePaSwin): unknown arch 'huge'", "['base', 'small', 'tiny']"],
        ),
        (
            'model.backbone.out_indices=(1,2,4)',
            ['model.backbone (RePaSwin): out_indices (1, 2, 4)', 'in [0, 3]'],
        ),
        ('model.backbone.idle_ratio=1.5', ['model.backbone (RePaSwin): idle_ratio', 'got 1.5']),
        *(  # a whole part replaced by a value (issue 39: AttributeError tracebacks)
            (f'{part}=1', [f'{part} is 1 (of type int), not a dict of options: set its keys'])
            for part in ('model', 'model.backbone', 'test_dataloader', 'optim_wrapper')
        ),
        (
            'train_dataloader.dataset.metainfo.classes=(cat,dog)',
            [
                "train_dataloader.dataset.metainfo.classes ('cat', 'dog') names none of the 3 "
                'categories',
                '(circle, square, triangle): the data set would be empty',
            ],
        ),
    ],
)
def test_train_names_a_bad_option_in_one_line(setup, option, expected):
    log = train_with(setup, option)
    assert log.startswith('tools/train.py: '), log
    for part in expected:
        assert part in log, log


@pytest.mark.parametrize(
    'option, expected',
    [
        (
            'train_cfg.max_epoch=1',
            "train_cfg.max_epoch: EpochBasedTrainLoop takes no argument 'max_epoch': did you mean "
            "'max_epochs'?",
        ),
        (
            'train_dataloader.batchsize=2',
            "train_dataloader.batchsize: DataLoader takes no argument 'batchsize': did you mean "
            "'batch_size'?",
        ),
        (
            'optim_wrapper.optimizer.lrr=0.1',
            "optim_wrapper.optimizer.lrr: AdamW takes no argument 'lrr': did you mean 'lr'?",
        ),
        (
            'default_hooks.checkpoint.intervall=1',
            "default_hooks.checkpoint.intervall: CheckpointHook takes no argument 'intervall': "
            "did you mean 'interval'?",
        ),
        (
            'val_evaluator.metrc=bbox',
            "val_evaluator.metrc: CocoMetric takes no argument 'metrc': did you mean 'metric'?",
        ),
        (
            'param_scheduler.0.begn=0',
            "param_scheduler.0.begn: LinearLR takes no argument 'begn': did you mean 'begin'?",
        ),
    ],
)
def test_train_names_a_key_no_runner_part_takes_in_one_line(setup, option, expected):
    # the loops, data loaders, optimizer, hooks, evaluators and schedulers the Runner builds
    # after its print-out (issue 37, point 4)
    log = train_with(setup, option)
    assert log.strip() == f'tools/train.py: {expected}', log


def test_train_names_a_misspelt_or_misordered_class(setup):
    log = train_with(setup, 'train_dataloader.dataset.metainfo.classes=(circle,sqare,triangle)')
    assert "'sqare' not among the categories" in log and "'sqare' -> 'square'" in log, log
    log = train_with(setup, 'train_dataloader.dataset.metainfo.classes=(square,circle,triangle)')
    assert "give them as ('circle', 'square', 'triangle')" in log, log


def test_test_names_a_checkpoint_of_another_model(setup):
    root, cfg_options, ckpt = setup
    log = run_until_error(
        'tools/test.py',
        DEMO,
        ckpt['other'],
        '--work-dir',
        str(root / 'work'),
        '--cfg-options',
        *cfg_options,
    )
    assert f'tools/test.py: {ckpt["other"]} (CHECKPOINT argument): checkpoint does not fit' in log
    assert 'backbone.patch_embed.projection.weight has shape (16, 3, 4, 4)' in log, log
    assert not osp.exists(root / 'work')  # stopped before the Runner


def test_image_demo_names_a_checkpoint_of_a_bare_backbone(setup):
    # init_model's strict load would list every missing key of the detector in a traceback
    root, _, _ = setup
    bare = str(root / 'bare_backbone.pth')
    torch.save(dict(state_dict=init_model(DEMO).backbone.state_dict()), bare)
    log = run_until_error(
        'tools/image_demo.py',
        DEMO,
        bare,
        str(root / 'data/val/00000.png'),
        '--out-file',
        str(root / 'out.png'),
    )
    assert f'tools/image_demo.py: {bare} (checkpoint) holds no weights of this RePaSwin' in log


@pytest.mark.parametrize('script', ['tools/image_demo.py', 'tools/vis_features.py'])
def test_image_tools_name_a_file_that_is_not_an_image(setup, script):
    root, _, ckpt = setup
    text = root / 'notes.jpg'
    text.write_text('a text file, not an image\n')
    log = run_until_error(
        script, DEMO, ckpt['good'], str(text), '--out-file', str(root / 'out.png')
    )
    assert f'{script}: cannot read image {text}: not an image file' in log, log


def mmdet_train_error(setup, option):
    """mmdet's own tools/train.py (as ``mim train mmdet`` runs it) on the demo config up to its
    error: the exception, raised inside mmengine's Runner."""
    root, cfg_options, _ = setup
    with pytest.raises(Exception) as raised:
        run_script_here(
            MMDET_TRAIN,
            DEMO,
            '--work-dir',
            str(root / 'mmdet_work'),
            '--cfg-options',
            *cfg_options,
            option,
        )
    return raised.value


@pytest.mark.parametrize(
    'option, expected',
    [
        (
            'model.backbone.idle_ratio=1.5',
            'ConfigError: model.backbone (RePaSwin): idle_ratio must be in [0, 1] (one value or '
            'one per stage), got 1.5',
        ),
        (
            'model.backbone.type=RePaSwn',
            "model.backbone.type='RePaSwn' is not a registered type in scope 'mmdet': did you mean "
            "'RePaSwin'?",
        ),
        # raised by mmdet's CocoDataset as "need at least one array to concatenate"
        (
            'train_dataloader.dataset.metainfo.classes=(cat,dog)',
            "train_dataloader.dataset.metainfo.classes ('cat', 'dog') names none of the 3 "
            'categories of {data}annotations/train.json (circle, square, triangle): the data set '
            'would be empty; use names from the annotation file',
        ),
        # raised by EpochBasedTrainLoop as "got an unexpected keyword argument 'max_epoch'"
        (
            'train_cfg.max_epoch=1',
            "train_cfg.max_epoch: EpochBasedTrainLoop takes no argument 'max_epoch': did you mean "
            "'max_epochs'?",
        ),
        (
            'load_from={other}',
            'CheckpointError: checkpoint does not fit this model: backbone.patch_embed.projection.'
            'weight has shape (16, 3, 4, 4) in the checkpoint but (32, 3, 4, 4) in the model. '
            'Is it a checkpoint of another arch (embed_dims, depths, idle_ratio, window_size)?',
        ),
    ],
)
def test_mmdets_own_tools_end_with_one_line_not_a_traceback(setup, option, expected, monkeypatch):
    root, _, ckpt = setup
    err = mmdet_train_error(setup, option.format(other=ckpt['other']))
    expected = expected.format(data=f'{root}/data/')
    assert explain(err, err.__traceback__) == expected
    stderr = io.StringIO()
    monkeypatch.setattr(sys, 'stderr', stderr)
    _excepthook(type(err), err, err.__traceback__, previous=None)  # what `import mmrepa` installs
    assert stderr.getvalue() == f'{expected}\n{TRACEBACK_HINT}\n'


def test_a_misspelt_type_of_any_registry_gets_did_you_mean():
    from mmdet.registry import TRANSFORMS

    with pytest.raises(KeyError) as raised:
        TRANSFORMS.build(dict(type='LoadImageFromFil'))
    assert explain(raised.value, raised.tb) == (
        "'LoadImageFromFil' is not registered in the mmdet transform registry: did you mean "
        "'LoadImageFromFile'?"
    )
    assert explain(KeyError('an ordinary missing key')) is None  # left to the traceback
