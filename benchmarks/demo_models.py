"""The trained demo models the deployment benchmarks measure, and a runner for the tools.

The checkpoints come from ``tools/demo.py`` (work_dirs/demo/...), except two trained with
``tools/train.py``: the RepVGG baseline (the RepOpt-VGG demo config in RepVGG mode, plain SGD)

    python tools/train.py configs/demo/repopt_vgg_shapes.py --work-dir work_dirs/demo/repvgg \
        --cfg-options model.backbone.mode=repvgg model.backbone.scales=None \
        optim_wrapper.constructor=DefaultOptimWrapperConstructor optim_wrapper.optimizer.type=SGD

and the depth-reparameterized ViT

    python tools/train.py configs/demo/classifier_depthrep_vit_shapes.py \
        --work-dir work_dirs/demo/depthrep_vit
"""

import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, NamedTuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'work_dirs', 'demo')


class DemoModel(NamedTuple):
    what: str  # the kind of model
    backbone: str  # the backbone family
    config: str  # under DEMO: the config saved next to the checkpoint
    checkpoint: str  # under DEMO

    def paths(self):
        return osp.join(DEMO, self.config), osp.join(DEMO, self.checkpoint)

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
    """Run ``tools/<tool>`` in its own process (one thread unless OMP_NUM_THREADS says
    otherwise) and return the JSON it wrote to ``dump``."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
    command = [sys.executable, osp.join(ROOT, 'tools', tool), *args]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
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
