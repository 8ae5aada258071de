"""The parameter-free and fixed token mixers of PoolFormer and the MetaFormer baselines:
pooling and random mixing (MetaFormer baselines, Sec. 2.2, Eq. 5; identity mapping, Eq. 4, is
``nn.Identity``). Channels-last, as
:class:`SepConv`: (B, H, W, C) -> (B, H, W, C)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import InputError


class Pooling(nn.Module):
    """PoolFormer's mixer: ``avg_pool(x) - x``, k x k, stride 1, padding k // 2, the border
    averages over the pixels inside the map only (``count_include_pad=False``)."""

    def __init__(self, pool_size: int = 3):
        super().__init__()
        self.pool_size = pool_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the NCHW view of a channels-last tensor: avg_pool2d runs on it without a copy
        nchw = x.permute(0, 3, 1, 2)
        y = F.avg_pool2d(
            nchw, self.pool_size, 1, self.pool_size // 2, count_include_pad=False
        ).permute(0, 2, 3, 1)
        return y - x

    def extra_repr(self) -> str:
        return f'pool_size={self.pool_size}'


class RandomMixing(nn.Module):
    """RandFormer's mixer: ``W_R X`` over the N = H x W tokens, W_R (N, N) a row-softmax of
    uniform noise, frozen after initialisation (a parameter with ``requires_grad=False``,
    so checkpoints carry it, named ``random_matrix`` as in the MetaFormer release).

    W_R is a matrix over the token positions of one grid (``grid`` = (H, W), 14 x 14 in
    stage 3 of a 224-pixel input): a map of any other size has no such matrix, and is
    refused rather than resized or windowed, which would be another model than the one
    trained.
    """

    def __init__(self, grid: tuple):
        super().__init__()
        self.grid = tuple(grid)
        n = self.grid[0] * self.grid[1]
        self.random_matrix = nn.Parameter(
            torch.softmax(torch.rand(n, n), dim=-1), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        if (H, W) != self.grid:
            raise InputError(
                f'random mixing is a fixed matrix over a {self.grid[0]} x {self.grid[1]} token '
                f'grid and got {H} x {W} tokens: RandFormer runs at its img_size only'
            )
        return torch.matmul(self.random_matrix, x.reshape(B, H * W, C)).view(B, H, W, C)

    def extra_repr(self) -> str:
        return f'grid={self.grid}'
