"""DepthRepViT: a ViT whose blocks train as parallel branches joined by a scheduled λ and fold
into one branch each. :mod:`.branches` holds the stacked branch layouts, λ and the diversity
term; :mod:`.attention`, :mod:`.ffn` and :mod:`.block` the joined layers; :mod:`.backbone` the
model."""

from .attention import JoinedAttention
from .backbone import DepthRepViT
from .block import JoinedBlock
from .branches import (
    BranchSumLinear,
    stack_attention_branches,
    stack_ffn_branches,
    unstack_attention_branches,
    unstack_ffn_branches,
)
from .ffn import JoinedFFN

__all__ = [
    'DepthRepViT',
    'BranchSumLinear',
    'JoinedAttention',
    'JoinedBlock',
    'JoinedFFN',
    'stack_attention_branches',
    'stack_ffn_branches',
    'unstack_attention_branches',
    'unstack_ffn_branches',
]
