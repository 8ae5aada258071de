"""DepthRepViT: a ViT whose blocks train as parallel branches joined by a scheduled λ and fold
into one branch each (:mod:`.join` holds the joined layers, :mod:`.backbone` the model)."""

from .backbone import DepthRepViT
from .join import (
    BranchSumLinear,
    JoinedAttention,
    JoinedBlock,
    JoinedFFN,
    stack_attention_branches,
    stack_ffn_branches,
    unstack_attention_branches,
    unstack_ffn_branches,
)

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
