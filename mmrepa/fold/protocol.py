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

Folds are all or nothing. Before anything changes, :func:`fold_model` and every mmrepa module's
``reparameterize()`` check the whole (sub)model (:func:`check_foldable`): a module in training
mode, and whatever a module that is not folded yet reports from its side-effect-free
``fold_problems()`` (λ below 1, BatchNorm statistics that are missing or not finite, ...), is
refused with one :class:`FoldError` naming the module. A fold that fails anyway, after the
check passed (a foreign module's fold raising, memory running out), is undone
(:func:`all_or_nothing`): parameters, buffers, submodules and flags are as they were.
"""

import contextlib
import copy
import functools
import inspect
import itertools
import threading
from collections import Counter
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import FoldError  # defined with the other errors; importable from here as before

# Tried in this order on modules that are not mmrepa's.
FOREIGN_FOLD_METHODS = ('switch_to_deploy', 'reparameterize', 'fuse')


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


class Reparameterizable:
    """Mixin of mmrepa's foldable modules: the checks every fold makes, and
    ``switch_to_deploy()`` as another name of ``reparameterize()``.

    A subclass implements ``reparameterize()`` (fold in place, idempotent, set ``deploy``)
    and, if its fold can be refused, :meth:`fold_problems`. Every ``reparameterize`` a
    subclass defines is wrapped, once, when the class is created: it first refuses training
    mode and every problem of the module and its descendants (:func:`check_foldable`, which
    changes nothing), then folds all or nothing (:func:`all_or_nothing`). These checks live
    here only; a subclass does not repeat them.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fold = cls.__dict__.get('reparameterize')
        if callable(fold) and not getattr(fold, '_checked_fold', False):
            cls.reparameterize = _checked_fold(fold)

    def fold_problems(self) -> List[str]:
        """Why this module (not its descendants, which answer for themselves) cannot be
        folded as it is, one reason per entry; ``[]`` if it can. Reads only. Training mode is
        checked for every module alike (:func:`check_eval_mode`) and is not listed here."""
        return []

    def check_foldable(self) -> None:
        """Raise :class:`FoldError` if :meth:`reparameterize` would refuse (training mode,
        a problem of this module or a descendant); changes nothing."""
        check_foldable(self)

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


def _checked_fold(fold):
    """``fold`` (a subclass's ``reparameterize``) behind :func:`check_foldable` and
    :func:`all_or_nothing`."""

    @functools.wraps(fold)
    def reparameterize(self):
        check_foldable(self)
        with all_or_nothing(self):
            return fold(self)

    reparameterize._checked_fold = True
    return reparameterize


def _callable_without_arguments(fn) -> bool:
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
    )


def is_foldable(module: nn.Module) -> bool:
    """Whether ``module`` has a fold method callable without arguments, of any convention."""
    return any(
        _callable_without_arguments(getattr(module, name, None)) for name in FOREIGN_FOLD_METHODS
    )


def _is_mmrepa(module: nn.Module) -> bool:
    return type(module).__module__.startswith('mmrepa.') and _callable_without_arguments(
        getattr(module, 'reparameterize', None)
    )


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
    folded: Counter  # type name -> modules folded
    idle: List[str]  # modules whose fold methods changed nothing


def _fold_one(module: nn.Module, name: str, walk: _Walk) -> nn.Module:
    """Fold ``module`` by its convention; returns it, or the module that replaces it."""
    if getattr(module, 'deploy', None) is True:
        return module  # folded already; a foreign fold method may not be idempotent
    methods = ('reparameterize',) if _is_mmrepa(module) else FOREIGN_FOLD_METHODS
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


def _label(model: nn.Module) -> str:
    """How a refusal names the module whose own ``reparameterize()`` was called."""
    describe = getattr(model, 'describe', None)
    return describe() if _callable_without_arguments(describe) else type(model).__name__


def _where(module: nn.Module, path: str, root: Optional[str]) -> str:
    """``path (Type)`` inside a whole model (``root`` None), else relative to ``root``."""
    if root is None:
        return f'{path or "the model"} ({type(module).__name__})'
    return f'{root} at {path} ({type(module).__name__})' if path else root


def check_eval_mode(model: nn.Module, whole_model: bool = False) -> None:
    """Refuse a model that is (partly) in training mode: folds read BatchNorm running
    statistics, which are only what the model computes in eval mode. One line naming the
    first module in training mode (``whole_model``: ``model`` is the whole model, as
    :func:`fold_model` folds it, rather than a module whose ``reparameterize()`` was called)."""
    training = [
        (name, m)
        for name, m in _post_order(model)
        if m.training and (m is model or is_foldable(m) or isinstance(m, _BatchNorm))
    ]
    if training:
        name, first = training[0]
        first = _where(first, name, None) if name or whole_model else 'itself'
        raise FoldError(
            f'cannot fold {"the model" if whole_model else _label(model)}: {len(training)} '
            f'module(s) are in training mode (first: {first}), and folding reads the '
            'BatchNorm running statistics that only eval mode uses; call model.eval() first'
        )


def find_fold_problems(model: nn.Module) -> List[Tuple[str, nn.Module, str]]:
    """``(path, module, reason)`` for every reason ``model`` cannot be folded as it is,
    deepest module first: what each module that is not folded yet (``deploy`` not True)
    reports from its ``fold_problems()`` (every mmrepa foldable module has one; foreign
    modules may). Reads only; training mode is :func:`check_eval_mode`'s."""
    problems = []
    for path, module in _post_order(model):
        if getattr(module, 'deploy', None) is True:
            continue
        own = getattr(module, 'fold_problems', None)
        if _callable_without_arguments(own):
            problems += [(path, module, reason) for reason in own()]
    return problems


def check_foldable(model: nn.Module, whole_model: bool = False) -> None:
    """Raise :class:`FoldError` if folding ``model`` would be refused: a module in training
    mode, or a problem :func:`find_fold_problems` finds. The message is one line naming the
    first module (and how many more problems there are; ``whole_model`` as
    :func:`check_eval_mode`). Changes nothing, so a refused fold leaves the model as it was."""
    check_eval_mode(model, whole_model)
    root = None if whole_model else _label(model)
    problems = find_fold_problems(model)
    if problems:
        path, module, reason = problems[0]
        more = [_where(m, p, root) for p, m, _ in problems[1:]]
        tail = (
            (
                f' [{len(more)} more problem(s): {", ".join(more[:3])}'
                f'{", ..." if len(more) > 3 else ""}]'
            )
            if more
            else ''
        )
        raise FoldError(f'cannot fold {_where(module, path, root)}: {reason}{tail}')


_FOLDING = threading.local()  # how deep this thread is in all_or_nothing blocks


class _Snapshot:
    """Everything a fold can change in a model, to put it back: each module's attributes
    (its class, ``__dict__`` and the contents of the dicts, sets and lists in it: parameters,
    buffers, submodules, ``deploy``, ...) and each tensor's values (copied to the CPU, so
    that a fold on a full GPU does not run out of memory because of the copy) and
    ``requires_grad``."""

    def __init__(self, model: nn.Module):
        self.modules = []
        for module in model.modules():
            attrs = dict(module.__dict__)
            contents = {
                k: copy.copy(v) for k, v in attrs.items() if isinstance(v, (dict, set, list))
            }
            self.modules.append((module, type(module), attrs, contents))
        self.tensors, seen = [], set()
        for module in model.modules():
            for t in itertools.chain(module._parameters.values(), module._buffers.values()):
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    self.tensors.append(
                        (t, t.detach().to('cpu', copy=True), t.device, t.requires_grad)
                    )

    def restore(self) -> None:
        for module, cls, attrs, contents in self.modules:
            if type(module) is not cls:
                module.__class__ = cls
            module.__dict__.clear()
            module.__dict__.update(attrs)
            for key, saved in contents.items():  # in place: hook handles refer to the dicts
                live = attrs[key]
                if isinstance(live, list):
                    live[:] = saved
                else:
                    live.clear()
                    live.update(saved)
        with torch.no_grad():
            for t, saved, device, requires_grad in self.tensors:
                if t.shape == saved.shape and t.dtype == saved.dtype and t.device == device:
                    t.copy_(saved)  # in place: tensors sharing storage stay shared
                else:  # a fold that replaced .data
                    t.data = saved.to(device)
                t.requires_grad_(requires_grad)


@contextlib.contextmanager
def all_or_nothing(model: nn.Module):
    """Undo every change to ``model`` if the block raises. The outermost block of a thread
    takes a snapshot (:class:`_Snapshot`: a copy of every tensor, on the CPU); nested blocks
    (a module's fold calling its children's) rely on it."""
    depth = getattr(_FOLDING, 'depth', 0)
    snapshot = _Snapshot(model) if depth == 0 else None
    _FOLDING.depth = depth + 1
    try:
        yield
    except BaseException:
        if snapshot is not None:
            snapshot.restore()
        raise
    finally:
        _FOLDING.depth = depth


def _deploy_false(model: nn.Module) -> List[str]:
    return [
        f'{name or "the model"} ({type(m).__name__}): deploy=False'
        for name, m in _post_order(model)
        if getattr(m, 'deploy', None) is False
    ]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def fold_model(model: nn.Module, logger: Optional[str] = 'current') -> FoldReport:
    """Fold ``model`` for inference, in place, by every convention above; report what it did.

    The model must be in eval mode (folds read BatchNorm running statistics). All or
    nothing: the whole model is checked first (:func:`check_foldable`: training mode, and
    every module's ``fold_problems()``) and a refusal changes nothing; a fold that fails after
    the check passed is undone (:func:`all_or_nothing`, which holds a CPU copy of the model's
    tensors while folding). Modules that still have ``deploy=False``, or a fold method that
    changed nothing, are named in a warning (and in the report). ``logger``: where the
    summary goes (``None``: nowhere).
    """
    check_foldable(model, whole_model=True)
    before = count_parameters(model)
    walk = _Walk(Counter(), [])
    with all_or_nothing(model):
        _fold_tree(model, '', walk)
        model = _fold_one(model, '', walk)
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


def reparameterize(model: nn.Module) -> nn.Module:
    """Fold ``model`` for inference, in place, and return it (see :func:`fold_model`, which
    also returns what was folded). Calling this again on a folded model changes nothing."""
    return fold_model(model).model
