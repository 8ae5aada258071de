import subprocess
import sys

import pytest
from mmengine.registry import DefaultScope


def test_import_mmrepa_does_not_import_mmdet_or_mmseg():
    """Nor do the data set generators; the ADE20K-like data set imports mmseg when it is used."""
    code = (
        'import sys, mmrepa, mmrepa.datasets\n'
        'bad = sorted(m for m in sys.modules if m.split(".")[0] in ("mmdet", "mmseg", '
        '"mmpretrain"))\n'
        'print(bad)\n'
        'assert not bad, bad\n'
        'mmrepa.datasets.ShapesADE20KDataset\n'
        'assert "mmseg" in sys.modules\n'
    )
    subprocess.run([sys.executable, '-c', code], check=True)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_backbone_and_hook_resolve_from_downstream_scopes(scope):
    import importlib

    import mmrepa  # noqa: F401

    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        backbone = registry.MODELS.build(
            dict(
                type='RePaSwin',
                arch=dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2)),
                out_indices=(0, 1),
            )
        )
        hook = registry.HOOKS.build(dict(type='ReparameterizeHook'))
    assert type(backbone).__name__ == 'RePaSwin'
    assert type(hook).__name__ == 'ReparameterizeHook'


def test_layer_names_taken_by_another_plugin_do_not_break_import():
    """Generic layer names live in mmrepa's child registry; the root keeps only backbones and
    hooks, which must resolve from every scope."""
    code = (
        'import torch.nn as nn\n'
        'from mmengine.registry import MODELS\n'
        'for name in ("StarReLU", "SepConv", "RepBN", "PRepBN", "ChannelIdleFFN"):\n'
        '    MODELS.register_module(name=name, module=type(name, (nn.Module, ), {}))\n'
        'import mmrepa\n'
        'from mmrepa.registry import MODELS as OWN\n'
        'from mmrepa.layers import PRepBN\n'
        'from mmdet.registry import MODELS as MMDET\n'
        'from mmengine.registry import DefaultScope\n'
        'assert MODELS.get("PRepBN") is not PRepBN and OWN.get("PRepBN") is PRepBN\n'
        'with DefaultScope.overwrite_default_scope("mmdet"):\n'
        '    assert MMDET.get("mmrepa.PRepBN") is PRepBN\n'
        '    m = MMDET.build(dict(type="PRepBNSwin", arch=dict(embed_dims=16, depths=(1, 1),'
        ' num_heads=(1, 2)), out_indices=(1, )))\n'
        '    assert any(isinstance(x, PRepBN) for x in m.modules())\n'
        'own = sorted(k for k, v in MODELS.module_dict.items() '
        'if v.__module__.startswith("mmrepa"))\n'
        # the backbones and the neck only: the layers are in mmrepa's own registry
        'from mmrepa.backbones import __all__ as backbones\n'
        'assert own == sorted([*backbones, "SimpleFPN"]), own\n'
    )
    subprocess.run([sys.executable, '-c', code], check=True)
