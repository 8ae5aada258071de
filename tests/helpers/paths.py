"""The repository's paths."""

import glob
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def config_paths():
    """Every config file under configs/, in its folders."""
    return sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))
