"""MetaFormer checkpoints that need timm's converter, without timm (an optional extra)."""

import sys

import pytest
import torch

from mmrepa.backbones.metaformer import ConvFormer
from mmrepa.errors import DependencyError


def test_a_release_checkpoint_without_timm_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    model = ConvFormer(arch=dict(depths=(1, 1, 1, 1), dims=(8, 8, 8, 8)))
    # the sail-sg/metaformer release's names, which only timm's filter maps
    path = tmp_path / 'release.pth'
    torch.save({'downsample_layers.0.conv.weight': torch.zeros(8, 3, 7, 7)}, path)
    monkeypatch.setitem(sys.modules, 'timm', None)  # import timm fails as if not installed
    with pytest.raises(DependencyError) as err:
        model.load_pretrained(str(path))
    message = str(err.value)
    assert '\n' not in message and 'needs timm' in message and '[timm]' in message, message
