"""Windowed self-attention (CAFormer's and the plain ViTs' attention), against a naive window
loop, and its memory at detection sizes."""

import copy
import weakref

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mmrepa.layers import WindowedSelfAttention
from tests.helpers import max_abs_diff, naive_windowed_attention, randomize_

# Tolerances: float64 against the naive window loop at 1e-12, u64 = 2^-53 ≈ 1.1e-16 times a
# size factor (sums of ≤ ~10^2 terms of magnitude ≲ 10 in the scores and the weighted values);
# a wrong window, shift or key mask moves outputs by 1e-3 or more.


@pytest.mark.parametrize(
    'window, hw', [(None, (5, 7)), (3, (5, 7)), (3, (6, 9)), (4, (3, 11)), (7, (7, 7)), (7, (3, 5))]
)
def test_windowed_attention_matches_a_naive_window_loop(window, hw):
    attn = randomize_(WindowedSelfAttention(24, head_dim=8, window_size=window)).double()
    x = torch.randn(2, *hw, 24, dtype=torch.float64)
    with torch.no_grad():
        assert max_abs_diff(attn(x), naive_windowed_attention(attn, x, window)) <= 1e-12


def test_a_window_covering_the_map_is_global_attention():
    glob = randomize_(WindowedSelfAttention(16, head_dim=8)).double()
    win = copy.deepcopy(glob)
    win.window_size = 4
    x = torch.randn(1, 4, 4, 16, dtype=torch.float64)
    with torch.no_grad():
        assert max_abs_diff(win(x), glob(x)) <= 1e-12
        x = torch.randn(1, 5, 4, 16, dtype=torch.float64)  # now two windows: not global
        assert max_abs_diff(win(x), glob(x)) > 1e-3


def test_attention_heads_follow_timm():
    assert WindowedSelfAttention(320).num_heads == 10  # head_dim 32
    assert WindowedSelfAttention(576).num_heads == 18
    assert WindowedSelfAttention(20, head_dim=32).num_heads == 1
    assert WindowedSelfAttention(384).qkv.bias is None


@pytest.mark.parametrize('window', [0, 2.5, True])
def test_bad_window_size_says_what_is_allowed(window):
    with pytest.raises(ValueError, match='window_size must be an integer >= 1 or None'):
        WindowedSelfAttention(16, window_size=window)


class PeakMemory(TorchDispatchMode):
    """Peak bytes of live tensors created under this mode (views and in-place ops excluded)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    nbytes = t.untyped_storage().nbytes()
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t.untyped_storage(), self._free, nbytes)
        return out

    def _free(self, nbytes):
        self.live -= nbytes


def attention_peak_mib(window, hw, dims=384):
    """Peak memory of one CAFormer-M36 stage-3 attention layer on a (1, H, W, 384) map.

    On the meta device (shapes only, nothing allocated) and with the math backend, which
    materialises the attention matrix as the reference implementation does.
    """
    with torch.device('meta'):
        attn = WindowedSelfAttention(dims, window_size=window)
        x = torch.empty(1, *hw, dims)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), PeakMemory() as mem:
        attn(x)
    return mem.peak / 2**20


def test_windowed_attention_memory_stays_bounded_at_800x1333():
    stage3 = (50, 84)  # the stride-16 map of an 800 x 1333 image
    global_mib = attention_peak_mib(None, stage3)
    windowed_mib = attention_peak_mib(14, stage3)
    # global: 12 heads x 4200^2 fp32 scores = 807 MiB per (4200 x 4200) matrix stack, and the
    # math backend holds about three at once; windowed: 24 windows x 12 heads x 196^2 = 42 MiB
    assert global_mib > 2000
    assert windowed_mib < 256
    # doubling the image area doubles windowed memory (linear), but quadruples global
    larger = (100, 84)
    assert attention_peak_mib(14, larger) < 2.1 * windowed_mib
    assert attention_peak_mib(None, larger) > 3.9 * global_mib
