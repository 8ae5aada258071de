"""MixToken (LV-ViT, Jiang et al. 2021): CutMix on the patch-token grid.

While training, a box of patch tokens is replaced by the tokens at the same places of the batch
flipped (sample ``i`` takes sample ``B - 1 - i``'s); the class token keeps its image. The
backbone puts the patch tokens back before its outputs, so that each token's label is its own
image's, and hands the box to the head in :class:`MixedTokens`, which mixes the class token's
target by the area left, ``lam = 1 - box area / grid area``.
"""

import math
from typing import NamedTuple, Sequence, Tuple

import torch


class TokenBox(NamedTuple):
    """Rows ``top:bottom`` and columns ``left:right`` of an ``grid`` (h, w) token grid."""

    top: int
    bottom: int
    left: int
    right: int
    grid: Tuple[int, int]

    @property
    def lam(self) -> float:
        """The share of each image's own patch tokens: 1 - box area / grid area."""
        area = (self.bottom - self.top) * (self.right - self.left)
        return 1.0 - area / (self.grid[0] * self.grid[1])


def draw_token_box(grid: Tuple[int, int], beta: float) -> TokenBox:
    """LV-ViT's box (its ``rand_bbox``): ``lam ~ Beta(beta, beta)``, sides ``int(side ·
    sqrt(1 - lam))`` centred on a uniformly drawn token, clipped to the grid (so the area and
    the target's ``lam`` are the box's, not the drawn ``lam``). The release's box spans
    ``centre ± side // 2``: an odd side loses a token, kept as the release has it.

    Drawn from torch's default generator, so that a seed (mmengine's ``randomness``) fixes it.
    """
    h, w = grid
    lam = float(torch.distributions.Beta(beta, beta).sample())
    cut = math.sqrt(1.0 - lam)
    half_h, half_w = int(h * cut) // 2, int(w * cut) // 2
    cy, cx = (int(torch.randint(n, ())) for n in (h, w))
    return TokenBox(
        max(cy - half_h, 0), min(cy + half_h, h), max(cx - half_w, 0), min(cx + half_w, w), grid
    )


def swap_token_box(x: torch.Tensor, box: TokenBox, num_extra_tokens: int) -> torch.Tensor:
    """Tokens (B, extra + h·w, C) with the patch tokens inside ``box`` taken from the batch
    flipped. Its own inverse: applied again, every token is back in its image."""
    B, _, C = x.shape
    h, w = box.grid
    inside = torch.zeros(h, w, dtype=torch.bool, device=x.device)
    inside[box.top : box.bottom, box.left : box.right] = True
    patches = x[:, num_extra_tokens:]
    mixed = torch.where(inside.reshape(1, h * w, 1), patches.flip(0), patches)
    return torch.cat([x[:, :num_extra_tokens], mixed], dim=1)


class MixedTokens(tuple):
    """A backbone's outputs (a tuple, read as any) from a step that mixed tokens: ``box``, the
    :class:`TokenBox` a head needs to mix the class token's target."""

    box: TokenBox

    def __new__(cls, outputs: Sequence[torch.Tensor], box: TokenBox):
        self = super().__new__(cls, outputs)
        self.box = box
        return self
