"""Folding a whole model: mmrepa's protocol and the conventions of the rest of the ecosystem.

An mmrepa module that can be folded implements ``reparameterize()``: it replaces its
training-time structure by the equivalent inference structure, in place, sets ``deploy`` and
does nothing when called again (:class:`Reparameterizable` also answers ``switch_to_deploy()``,
the name mmpretrain, mmyolo and mmdeploy call). Other libraries fold in their own ways, and
:func:`fold_model` speaks them all, deepest module first:

- ``switch_to_deploy()``, in place (mmpretrain, mmyolo, RepVGG-style code);
- ``reparameterize()``, in place (timm's RepVGG, MobileOne, FastViT);
- ``fuse()`` returning the replacement module (timm).

A call only counts as a fold if it changes the module (its parameters, buffers, children or
``deploy`` flag) or returns a replacement: mmpretrain's ``RepVGGBlock.reparameterize()``
returns fused tensors and changes nothing, and is not taken for a fold.
"""
import inspect
from collections import Counter
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import FoldError  # defined with the other errors; importable from here as before

# Tried in this order on modules that are not mmrepa's.
FOREIGN_FOLD_METHODS = ('switch_to_deploy', 'reparameterize', 'fuse')


class FoldReport(NamedTuple):
    """What :func:`fold_model` did."""
    model: nn.Module                # the folded model (a replacement if the root was fused)
    folded: Dict[str, int]          # modules folded, by type name
    params_before: int
    params_after: int
    unfolded: List[str]             # modules that still look unfolded, with the reason

    def summary(self) -> str:
        kinds = ', '.join(f'{n} x{c}' for n, c in sorted(self.folded.items())) or 'nothing'
        return (f'folded {sum(self.folded.values())} module(s) ({kinds}); parameters '
                f'{self.params_before:,} -> {self.params_after:,}')


class Reparameterizable:
    """Mixin of mmrepa's foldable modules: ``switch_to_deploy()`` is ``reparameterize()``."""

    def switch_to_deploy(self) -> None:
        """:meth:`reparameterize` (in place, idempotent, sets ``deploy``) under the name
        mmpretrain's converter, mmyolo-style utilities and mmdeploy call. Those callers may
        not have called ``eval()`` yet (mmdeploy folds right after loading the checkpoint), so
        the fold runs in eval mode, reading the BatchNorm running statistics as
        ``reparameterize`` does, and every module gets its training flag back afterwards."""
        modes = {module: module.training for module in self.modules()}
        self.eval()
        try:
            self.reparameterize()
        finally:
            def restore(module, inherited):  # a module the fold created takes its parent's
                module.training = modes.get(module, inherited)
                for child in module.children():
                    restore(child, module.training)
            restore(self, modes[self])


def _callable_without_arguments(fn) -> bool:
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params)


def is_foldable(module: nn.Module) -> bool:
    """Whether ``module`` has a fold method callable without arguments, of any convention."""
    return any(_callable_without_arguments(getattr(module, name, None))
               for name in FOREIGN_FOLD_METHODS)


def _is_mmrepa(module: nn.Module) -> bool:
    return (type(module).__module__.startswith('mmrepa.')
            and _callable_without_arguments(getattr(module, 'reparameterize', None)))


def _post_order(module: nn.Module, prefix: str = '') -> Iterator[Tuple[str, nn.Module]]:
    for name, child in module.named_children():
        yield from _post_order(child, f'{prefix}.{name}' if prefix else name)
    yield prefix, module


def _structure(module: nn.Module) -> tuple:
    """What a fold changes: tensors (by name and shape) and submodules (by name and type).
    A call that only sets ``deploy`` found the module in its deployed form already (a
    LayerNorm patch embedding, say): that is not counted as a fold."""
    tensors = tuple((k, tuple(v.shape)) for k, v in module.state_dict(keep_vars=True).items())
    children = tuple((k, type(m)) for k, m in module.named_modules())
    return tensors, children


class _Walk(NamedTuple):
    folded: Counter   # type name -> modules folded
    idle: List[str]   # modules whose fold methods changed nothing


def _fold_one(module: nn.Module, name: str, walk: _Walk) -> nn.Module:
    """Fold ``module`` by its convention; returns it, or the module that replaces it."""
    if getattr(module, 'deploy', None) is True:
        return module  # folded already; a foreign fold method may not be idempotent
    methods = ('reparameterize', ) if _is_mmrepa(module) else FOREIGN_FOLD_METHODS
    tried = []
    for method in methods:
        fn = getattr(module, method, None)
        if not _callable_without_arguments(fn):
            continue
        tried.append(f'{method}()')
        before = _structure(module)
        try:
            result = fn()
        except FoldError as err:
            raise FoldError(f'cannot fold {name or "the model"} ({type(module).__name__}): '
                            f'{err}') from err
        if isinstance(result, nn.Module) and result is not module:  # timm's fuse()
            walk.folded[type(module).__name__] += 1
            return result
        if _structure(module) != before:
            walk.folded[type(module).__name__] += 1
            return module
        if getattr(module, 'deploy', None) is True:
            return module  # nothing to fold: only the flag was set
    if tried:
        walk.idle.append(f'{name or "the model"} ({type(module).__name__}): '
                         f'{", ".join(tried)} changed nothing')
    return module


def _fold_tree(module: nn.Module, prefix: str, walk: _Walk) -> None:
    """Fold every descendant of ``module``, deepest first, replacing fused children."""
    for child_name, child in list(module.named_children()):
        path = f'{prefix}.{child_name}' if prefix else child_name
        _fold_tree(child, path, walk)
        new = _fold_one(child, path, walk)
        if new is not child:
            setattr(module, child_name, new)


def fold_submodules(model: nn.Module) -> Dict[str, int]:
    """Fold every foldable submodule of ``model`` (not ``model`` itself), deepest first;
    returns the count of folded modules by type."""
    walk = _Walk(Counter(), [])
    _fold_tree(model, '', walk)
    return dict(walk.folded)


def check_eval_mode(model: nn.Module) -> None:
    """Refuse a model that is (partly) in training mode: folds read BatchNorm running
    statistics, which are only what the model computes in eval mode."""
    training = [name or type(model).__name__ for name, m in _post_order(model)
                if m.training and (m is model or is_foldable(m) or isinstance(m, _BatchNorm))]
    if training:
        raise FoldError(
            'reparameterize() needs a model in eval mode: folding uses BatchNorm running '
            f'statistics, but {len(training)} module(s) are in training mode (first: '
            f'{training[0]}). Call model.eval() first.')


def _deploy_false(model: nn.Module) -> List[str]:
    return [f'{name or "the model"} ({type(m).__name__}): deploy=False'
            for name, m in _post_order(model) if getattr(m, 'deploy', None) is False]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fold_model(model: nn.Module, logger: Optional[str] = 'current') -> FoldReport:
    """Fold ``model`` for inference, in place, by every convention above; report what it did.

    The model must be in eval mode (folds read BatchNorm running statistics). Modules that
    still have ``deploy=False``, or a fold method that changed nothing, are named in a warning
    (and in the report). ``logger``: where the summary goes (``None``: nowhere).
    """
    check_eval_mode(model)
    before = count_parameters(model)
    walk = _Walk(Counter(), [])
    _fold_tree(model, '', walk)
    model = _fold_one(model, '', walk)
    report = FoldReport(model, dict(walk.folded), before, count_parameters(model),
                        walk.idle + _deploy_false(model))
    if logger is not None:
        print_log(f'reparameterize: {report.summary()}', logger=logger)
        if report.unfolded:
            print_log(f'reparameterize: {len(report.unfolded)} module(s) may not be folded: '
                      + '; '.join(report.unfolded[:8])
                      + (' ...' if len(report.unfolded) > 8 else ''), logger=logger, level=30)
    return report


def reparameterize(model: nn.Module) -> nn.Module:
    """Fold ``model`` for inference, in place, and return it (see :func:`fold_model`, which
    also returns what was folded). Calling this again on a folded model changes nothing."""
    return fold_model(model).model
