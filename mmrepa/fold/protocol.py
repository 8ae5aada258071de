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
"""

from collections import Counter
from typing import Dict, List, NamedTuple, Optional

import torch.nn as nn
from mmengine.logging import print_log

from ..errors import FoldError  # defined with the other errors; importable from here as before
from .base import FoldPolicy, Reparameterizable
from .checks import (
    FOREIGN_FOLD_METHODS,
    _callable_without_arguments,
    _post_order,
    all_or_nothing,
    check_foldable,
)


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


def _structure(module: nn.Module) -> tuple:
    """What a fold changes: tensors (by name and shape) and submodules (by name and type).
    A call that only sets ``deploy`` found the module in its deployed form already (a
    LayerNorm patch embedding, say): that is not counted as a fold."""
    tensors = tuple((k, tuple(v.shape)) for k, v in module.state_dict(keep_vars=True).items())
    children = tuple((k, type(m)) for k, m in module.named_modules())
    return tensors, children


class _Walk(NamedTuple):
    folded: Counter  # type name -> modules folded
    idle: List[str]  # modules whose fold methods changed nothing


def _fold_one(module: nn.Module, name: str, walk: _Walk, policy: FoldPolicy) -> nn.Module:
    """Fold ``module`` by its convention; returns it, or the module that replaces it."""
    if getattr(module, 'deploy', None) is True:
        return module  # folded already; a foreign fold method may not be idempotent
    ours = isinstance(module, Reparameterizable)
    methods = ('reparameterize',) if ours else FOREIGN_FOLD_METHODS
    tried = []
    for method in methods:
        fn = getattr(module, method, None)
        if not _callable_without_arguments(fn):
            continue
        tried.append(f'{method}()')
        before = _structure(module)
        try:
            result = fn(policy) if ours else fn()
        except FoldError as err:
            raise FoldError(
                f'cannot fold {name or "the model"} ({type(module).__name__}): {err}'
            ) from err
        if isinstance(result, nn.Module) and result is not module:  # timm's fuse()
            walk.folded[type(module).__name__] += 1
            return result
        if _structure(module) != before:
            walk.folded[type(module).__name__] += 1
            return module
        if getattr(module, 'deploy', None) is True:
            return module  # nothing to fold: only the flag was set
    if tried:
        walk.idle.append(
            f'{name or "the model"} ({type(module).__name__}): {", ".join(tried)} changed nothing'
        )
    return module


def _fold_tree(module: nn.Module, prefix: str, walk: _Walk, policy: FoldPolicy) -> None:
    """Fold every descendant of ``module``, deepest first, replacing fused children."""
    for child_name, child in list(module.named_children()):
        path = f'{prefix}.{child_name}' if prefix else child_name
        _fold_tree(child, path, walk, policy)
        new = _fold_one(child, path, walk, policy)
        if new is not child:
            setattr(module, child_name, new)


def fold_submodules(model: nn.Module, policy: Optional[FoldPolicy] = None) -> Dict[str, int]:
    """Fold every foldable submodule of ``model`` (not ``model`` itself), deepest first, by
    ``policy`` (default: the plain fold); returns the count of folded modules by type."""
    walk = _Walk(Counter(), [])
    _fold_tree(model, '', walk, policy or FoldPolicy())
    return dict(walk.folded)


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
