"""RepOpt-VGG: a plain VGG whose training-time structure lives in its optimizer
(:mod:`.blocks` holds the conv-BN layers of RepOpt, CSLA and RepVGG, :mod:`.backbone` the
model)."""

from .backbone import RepOptVGG
from .blocks import CSLAConvBN, PostSE, RepOptConvBN, RepVGGConvBN

__all__ = ['RepOptVGG', 'CSLAConvBN', 'PostSE', 'RepOptConvBN', 'RepVGGConvBN']
