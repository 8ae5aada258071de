"""mmrepa configs run by the tools users already have: mmdet's own ``tools/train.py`` (the
script ``mim train`` runs), ``mim test``, and mmdet's and mmseg's own ``tools/test.py``
(shipped in their packages' ``.mim``), with and without ReparameterizeHook, on small generated
data. The runs with the hook are the users' commands (subprocesses); the training and the plain
runs they are compared with run the same scripts in this process (``run_script_here``), without
a subprocess's imports (``mim train`` would start three interpreters: mim, the script's
``--help``, the script). So mmdet's train script is not run in a fresh interpreter here (with
mmrepa not yet imported): ``mim test`` shows that the config's ``custom_imports`` load mmrepa
there, and mmrepa's own ``tools/train.py`` trains in fresh processes in test_distributed.py and
the demo's smoke run."""

import os.path as osp
import sys

import pytest

from mmrepa.datasets import make_shapes_coco
from tests.helpers import (
    DEMO,
    ROOT,
    own_script,
    run,
    run_script_here,
    shapes_cfg_options,
    written_metrics,
)

UPERNET = osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')


def mim(*args, ok=True):
    return run(sys.executable, '-m', 'mim', *args, ok=ok)


def with_reparameterize_hook(base: str, path: str) -> str:
    """A config that inherits ``base`` and folds the model for testing."""
    with open(path, 'w') as f:
        f.write(
            f"_base_ = {base!r}\ncustom_hooks = [dict(type='ReparameterizeHook', verify=True)]\n"
        )
    return path


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    """(root, cfg options) of a tiny shapes data set the demo config reads."""
    root = tmp_path_factory.mktemp('downstream')
    data = make_shapes_coco(str(root / 'data'), num_train=8, num_val=4, size=64) + '/'
    options = shapes_cfg_options(data)
    return root, options


def test_mmdet_train_and_mim_test_with_and_without_reparameterize_hook(shapes):
    root, options = shapes
    work = str(root / 'train')
    # one epoch of two iterations, no validation: only the checkpoint is wanted
    run_script_here(
        own_script('mmdet', 'train'),
        DEMO,
        '--work-dir',
        work,
        '--cfg-options',
        *options,
        'train_cfg.max_epochs=1',
        'train_cfg.val_interval=2',
        'train_dataloader.batch_size=4',
        'default_hooks.checkpoint.interval=1',
    )
    ckpt = osp.join(work, 'epoch_1.pth')
    assert osp.exists(ckpt)

    # the plain test: the script mim runs (mmdet's own tools/test.py), in this process
    plain = str(root / 'test_plain')
    _, log = run_script_here(
        own_script('mmdet'), DEMO, ckpt, '--work-dir', plain, '--cfg-options', *options
    )
    assert 'coco/bbox_mAP' in log, log[-4000:]  # the log of this run was captured
    assert 'ReparameterizeHook' not in log
    metrics = written_metrics(plain)
    assert 'coco/bbox_mAP' in metrics

    folded = str(root / 'test_folded')
    config = with_reparameterize_hook(DEMO, str(root / 'demo_reparam.py'))
    log = mim(
        'test',
        'mmdet',
        config,
        '--checkpoint',
        ckpt,
        '--work-dir',
        folded,
        '--cfg-options',
        *options,
    )
    assert 'mmdet/.mim/tools/test.py' in log  # mim ran mmdet's own script
    assert 'ReparameterizeHook: folded model verified' in log, log[-4000:]
    assert 'ReparameterizeHook: reparameterized the model for testing' in log
    assert written_metrics(folded).keys() == metrics.keys()


def ade_like(root) -> str:
    """Two tiny images per split in ADE20K's layout (jpg images; png label maps, 0 = ignore)."""
    import numpy as np
    from PIL import Image

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


# a small RePa-Swin and narrow heads: the scripts and the hook are the point, not the size
SMALL_UPERNET = {
    'model.backbone.arch': None,
    'model.backbone.embed_dims': 16,
    'model.backbone.depths': [1, 1, 1, 1],
    'model.backbone.num_heads': [1, 1, 2, 2],
    'model.decode_head.in_channels': [16, 32, 64, 128],
    'model.decode_head.channels': 32,
    'model.auxiliary_head.in_channels': 64,
    'model.auxiliary_head.channels': 16,
}


def test_mmseg_own_test_script_with_and_without_reparameterize_hook(tmp_path):
    import torch

    from mmrepa.apis import init_model

    data = ade_like(tmp_path / 'ade')
    options = [
        *(f'{key}={str(value).replace(" ", "")}' for key, value in SMALL_UPERNET.items()),
        'model.backbone.init_cfg=None',
        'model.decode_head.norm_cfg.type=BN',
        'model.auxiliary_head.norm_cfg.type=BN',
        'test_dataloader.dataset.pipeline.1.scale=(64,64)',
        f'test_dataloader.dataset.data_root={data}',
        'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False',
    ]
    # a randomly initialised segmentor, saved as a checkpoint (testing does not need training)
    model = init_model(UPERNET, cfg_options=SMALL_UPERNET)
    ckpt = str(tmp_path / 'random.pth')
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), ckpt)
    script = own_script('mmseg')

    results = {}
    for name, config in (
        ('plain', UPERNET),
        ('folded', with_reparameterize_hook(UPERNET, str(tmp_path / 'reparam.py'))),
    ):
        work = str(tmp_path / name)
        args = (script, config, ckpt, '--work-dir', work, '--cfg-options', *options)
        if name == 'folded':  # the user's command
            log = run(sys.executable, *args)
        else:  # what it is compared with: the same script in this process, its log captured
            log = run_script_here(*args)[1]
            assert 'mIoU' in log, log[-4000:]
        results[name] = written_metrics(work)
        assert ('ReparameterizeHook: folded model verified' in log) == (name == 'folded'), log[
            -4000:
        ]
    assert 'mIoU' in results['plain']
    assert results['folded'].keys() == results['plain'].keys()


def integration_page_config() -> str:
    """The whole config of docs/integration.md, as a user copies it into their project."""
    with open(osp.join(ROOT, 'docs', 'integration.md'), encoding='utf-8') as f:
        page = f.read()
    section = page.split('### A whole config of your own project', 1)[1]
    return section.split('```python\n', 1)[1].split('```', 1)[0]


def test_the_whole_config_of_the_integration_page_trains_with_mmdets_own_script(tmp_path):
    """The page's config file, its data and ImageNet weights where it says, mmdet's own train
    script: two iterations on 96-pixel images start from those weights."""
    import torch

    from mmrepa.backbones import RePaSwin

    (tmp_path / 'retinanet_repa_swin_t_shapes.py').write_text(integration_page_config())
    make_shapes_coco(str(tmp_path / 'data' / 'shapes'), num_train=4, num_val=2, size=64)
    (tmp_path / 'checkpoints').mkdir()
    weights = RePaSwin(arch='tiny', idle_ratio=0.75, out_indices=(1, 2, 3)).state_dict()
    torch.save(dict(state_dict=weights), tmp_path / 'checkpoints' / 'repa_swin_tiny_in1k.pth')
    loaders = ('train_dataloader', 'val_dataloader')
    _, log = run_script_here(
        own_script('mmdet', 'train'),
        'retinanet_repa_swin_t_shapes.py',
        '--cfg-options',
        'train_cfg.max_epochs=1',
        'model.test_cfg.score_thr=0.0',  # an untrained detector's scores are low
        'default_hooks.checkpoint.save_optimizer=False',
        'train_dataloader.dataset.pipeline.2.scale=(96,96)',
        'val_dataloader.dataset.pipeline.1.scale=(96,96)',
        *(f'{loader}.num_workers=0' for loader in loaders),
        *(f'{loader}.persistent_workers=False' for loader in loaders),
        cwd=str(tmp_path),
    )
    assert 'from path: checkpoints/repa_swin_tiny_in1k.pth' in log, log[-3000:]
    assert 'Epoch(train) [1][2/2]' in log and 'coco/bbox_mAP' in log
    trained = torch.load(
        tmp_path / 'work_dirs' / 'retinanet_repa_swin_t_shapes' / 'epoch_1.pth', weights_only=False
    )['state_dict']
    # two AdamW steps in the warm-up (lr ~3e-7) move a weight by ~1e-6; another start, by ~1
    key = 'patch_embed.projection.weight'
    assert (trained[f'backbone.{key}'] - weights[key]).abs().max() < 1e-4
