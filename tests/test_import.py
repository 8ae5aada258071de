import subprocess
import sys

import pytest
from mmengine.registry import DefaultScope


def test_import_mmrepa_does_not_import_mmdet_or_mmseg():
    code = ('import sys, mmrepa\n'
            'bad = sorted(m for m in sys.modules if m.split(".")[0] in ("mmdet", "mmseg", '
            '"mmpretrain"))\n'
            'print(bad)\n'
            'assert not bad, bad\n')
    subprocess.run([sys.executable, '-c', code], check=True)


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
def test_backbone_and_hook_resolve_from_downstream_scopes(scope):
    import importlib
    import mmrepa  # noqa: F401
    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        backbone = registry.MODELS.build(
            dict(type='RePaSwin', arch=dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2)),
                 out_indices=(0, 1)))
        hook = registry.HOOKS.build(dict(type='ReparameterizeHook'))
    assert type(backbone).__name__ == 'RePaSwin'
    assert type(hook).__name__ == 'ReparameterizeHook'
