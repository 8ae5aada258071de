import pytest
import torch
from mmcv.cnn.bricks.transformer import PatchMerging

from mmrepa.backbones.swin import FoldablePatchMerging


@pytest.mark.parametrize('hw', [(10, 14), (7, 9), (1, 1), (3, 2)])
def test_fast_patch_merging_equals_mmcv(hw):
    ref = PatchMerging(in_channels=8, out_channels=16, stride=2)
    ours = FoldablePatchMerging(in_channels=8, out_channels=16, stride=2)
    ours.load_state_dict(ref.state_dict())
    assert ours._is_2x2  # the reshape path, not mmcv's unfold
    x = torch.randn(2, hw[0] * hw[1], 8)
    (y_ref, size_ref), (y, size) = ref(x, hw), ours(x, hw)
    assert size == size_ref
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
