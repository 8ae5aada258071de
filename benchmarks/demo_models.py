"""The trained demo models the deployment benchmarks measure, and a runner for the tools.

The checkpoints come from ``tools/demo.py`` (work_dirs/demo/...), except two trained with
``tools/train.py``: the RepVGG baseline (the RepOpt-VGG demo config in RepVGG mode, plain SGD)

    python tools/train.py configs/demo/repopt_vgg_shapes.py --work-dir work_dirs/demo/repvgg \
        --cfg-options model.backbone.mode=repvgg model.backbone.scales=None \
        optim_wrapper.constructor=DefaultOptimWrapperConstructor optim_wrapper.optimizer.type=SGD

and the depth-reparameterized ViT

    python tools/train.py configs/demo/classifier_depthrep_vit_shapes.py \
        --work-dir work_dirs/demo/depthrep_vit

The demo lives in this checkout unless a benchmark's ``--demo-root`` names another one (the
folder holding ``work_dirs/demo`` and the ``data/`` its configs name by relative paths); the
tools then run there, with this checkout's mmrepa.
"""

import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, NamedTuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_ROOT = ROOT  # where work_dirs/demo and data/ are: see use_demo_root


def use_demo_root(root: str) -> None:
    """Take the demo models from ``root``/work_dirs/demo and run the tools in ``root`` (where
    the configs' relative data paths point)."""
    global DEMO_ROOT
    DEMO_ROOT = osp.abspath(root)


def add_demo_root_argument(parser) -> None:
    parser.add_argument(
        '--demo-root',
        default=ROOT,
        help='the checkout whose work_dirs/demo (and data/) to measure (default: this one)',
    )


class DemoModel(NamedTuple):
    what: str  # the kind of model
    backbone: str  # the backbone family
    config: str  # under work_dirs/demo: the config saved next to the checkpoint
    checkpoint: str  # under work_dirs/demo

    def paths(self):
        demo = osp.join(DEMO_ROOT, 'work_dirs', 'demo')
        return osp.join(demo, self.config), osp.join(demo, self.checkpoint)

    def missing(self) -> List[str]:
        return [p for p in self.paths() if not osp.exists(p)]


MODELS = {
    'retinanet': DemoModel(
        'RetinaNet',
        'RePa-Swin',
        'retinanet/retinanet_repa_swin_shapes.py',
        'retinanet/epoch_20.pth',
    ),
    'classifier': DemoModel(
        'classifier',
        'RePa-CAFormer',
        'classification/classifier_repa_caformer_shapes.py',
        'classification/epoch_10.pth',
    ),
    'upernet': DemoModel(
        'UperNet',
        'RePa-ConvFormer',
        'upernet/upernet_repa_convformer_shapes.py',
        'upernet/epoch_8.pth',
    ),
    'mask-rcnn': DemoModel(
        'Mask R-CNN',
        'PRepBN-Swin',
        'mask-rcnn/mask-rcnn_prepbn_swin_shapes.py',
        'mask-rcnn/epoch_8.pth',
    ),
    # the config next to the checkpoint names its scales.pth
    'repopt': DemoModel(
        'classifier', 'RepOpt-VGG', 'repopt/repopt_vgg_shapes.py', 'repopt/epoch_6.pth'
    ),
    'repvgg': DemoModel(
        'classifier', 'RepVGG', 'repvgg/repopt_vgg_shapes.py', 'repvgg/epoch_6.pth'
    ),
    'depthrep-vit': DemoModel(
        'classifier',
        'DepthRepViT',
        'depthrep_vit/classifier_depthrep_vit_shapes.py',
        'depthrep_vit/epoch_30.pth',
    ),
}


def run_tool(tool: str, args: List[str], dump: str) -> dict:
    """Run this checkout's ``tools/<tool>`` in its own process (one thread unless
    OMP_NUM_THREADS says otherwise), in the demo root, and return the JSON it wrote to
    ``dump``."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'), PYTHONPATH=path)
    command = [sys.executable, osp.join(ROOT, 'tools', tool), *args]
    proc = subprocess.run(command, cwd=DEMO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(
            f'tools/{tool} {" ".join(args)} failed:\n' + (proc.stdout + proc.stderr)[-3000:]
        )
    with open(dump) as f:
        return json.load(f)


def threads_from_env() -> int:
    """One thread unless OMP_NUM_THREADS says otherwise, for this process's torch (and the
    onnxruntime sessions given torch's count) and the tools it runs: the thread count a
    benchmark records is then the one it measured with."""
    import torch

    os.environ.setdefault('OMP_NUM_THREADS', '1')
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    return torch.get_num_threads()


def stamp() -> dict:
    """When, and at which commit (marked if tracked files differ from it), a row was measured."""

    def git(*args):
        return subprocess.run(
            ['git', *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    modified = git('status', '--porcelain', '--untracked-files=no')
    return dict(
        measured=time.strftime('%Y-%m-%d %H:%M'),
        commit=git('rev-parse', '--short', 'HEAD') + (' (modified)' if modified else ''),
    )
