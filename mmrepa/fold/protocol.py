"""Folding a whole model: mmrepa's protocol and the conventions of the rest of the ecosystem.

A module that can be folded the mmrepa way is a :class:`Reparameterizable` (mmrepa's own, or a
user's subclass: the walk decides by type, not by where the class is defined); its
``reparameterize(policy)`` replaces its training-time structure by the equivalent inference
structure, in place, sets ``deploy`` and does nothing when called again (see
``docs/folding_protocol.md``). Other libraries fold in their own ways, and
:func:`fold_model` speaks them all, deepest module first:

- ``switch_to_deploy()``, in place (mmpretrain, mmyolo, RepVGG-style code);
- ``reparameterize()``, in place (timm's RepVGG, MobileOne, FastViT);
- ``fuse()`` returning the replacement module (timm).

A call only counts as a fold if it changes the module (its parameters, buffers, children or
``deploy`` flag) or returns a replacement: mmpretrain's ``RepVGGBlock.reparameterize()``
returns fused tensors and changes nothing, and is not taken for a fold.

Folds are all or nothing (:mod:`.checks`): the whole model is checked before anything changes,
and a fold that fails anyway is undone. Fold options (:class:`~mmrepa.fold.FoldPolicy`, e.g.
INT8's identity shortcuts kept apart) reach every mmrepa module's fold; foreign folds have none.
The walk itself is in :mod:`.base`: a module's own fold runs it on its descendants first.
"""

from collections import Counter
from typing import Dict, List, NamedTuple, Optional

import torch.nn as nn
from mmengine.logging import print_log

from ..errors import FoldError  # defined with the other errors; importable from here as before
from .base import FoldPolicy, _fold_one, _fold_tree, _Walk, fold_submodules
from .checks import _post_order, all_or_nothing, check_foldable

__all__ = [
    'FoldError',
    'FoldReport',
    'count_parameters',
    'fold_model',
    'fold_submodules',
    'reparameterize',
]


class FoldReport(NamedTuple):
    """What :func:`fold_model` did."""

    model: nn.Module  # the folded model (a replacement if the root was fused)
    folded: Dict[str, int]  # modules folded, by type name
    params_before: int
    params_after: int
    unfolded: List[str]  # modules that still look unfolded, with the reason

    def summary(self) -> str:
        kinds = ', '.join(f'{n} x{c}' for n, c in sorted(self.folded.items())) or 'nothing'
        return (
            f'folded {sum(self.folded.values())} module(s) ({kinds}); parameters '
            f'{self.params_before:,} -> {self.params_after:,}'
        )


def _deploy_false(model: nn.Module) -> List[str]:
    return [
        f'{name or "the model"} ({type(m).__name__}): deploy=False'
        for name, m in _post_order(model)
        if getattr(m, 'deploy', None) is False
    ]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fold_model(
    model: nn.Module, logger: Optional[str] = 'current', policy: Optional[FoldPolicy] = None
) -> FoldReport:
    """Fold ``model`` for inference, in place, by every convention above; report what it did.

    The model must be in eval mode (folds read BatchNorm running statistics). All or
    nothing: the whole model is checked first (:func:`check_foldable`: training mode, and
    every module's ``fold_problems()``) and a refusal changes nothing; a fold that fails after
    the check passed is undone (:func:`all_or_nothing`, which holds a CPU copy of the model's
    tensors while folding). Modules that still have ``deploy=False``, or a fold method that
    changed nothing, are named in a warning (and in the report). ``logger``: where the
    summary goes (``None``: nowhere). ``policy``: the fold options every mmrepa module's
    fold receives (:class:`~mmrepa.fold.FoldPolicy`; default: the plain fold).
    """
    policy = policy or FoldPolicy()
    check_foldable(model, whole_model=True)
    before = count_parameters(model)
    walk = _Walk(Counter(), [])
    with all_or_nothing(model):
        _fold_tree(model, '', walk, policy)
        model = _fold_one(model, '', walk, policy)
    report = FoldReport(
        model, dict(walk.folded), before, count_parameters(model), walk.idle + _deploy_false(model)
    )
    if logger is not None:
        print_log(f'reparameterize: {report.summary()}', logger=logger)
        if report.unfolded:
            print_log(
                f'reparameterize: {len(report.unfolded)} module(s) may not be folded: '
                + '; '.join(report.unfolded[:8])
                + (' ...' if len(report.unfolded) > 8 else ''),
                logger=logger,
                level=30,
            )
    return report


def reparameterize(model: nn.Module, policy: Optional[FoldPolicy] = None) -> nn.Module:
    """Fold ``model`` for inference, in place, and return it (see :func:`fold_model`, which
    also returns what was folded). Calling this again on a folded model changes nothing."""
    return fold_model(model, policy=policy).model
