"""The checks every fold makes before it changes anything, and the undo if it fails anyway.

Folds are all or nothing. Before anything changes, :func:`~mmrepa.fold.fold_model` and every
:class:`~mmrepa.fold.Reparameterizable`'s ``reparameterize()`` check the whole (sub)model
(:func:`check_foldable`): a module in training mode, and whatever a module that is not folded
yet reports from its side-effect-free ``fold_problems()`` (λ below 1, BatchNorm statistics that
are missing or not finite, ...), is refused with one :class:`FoldError` naming the module. A
fold that fails anyway, after the check passed (a foreign module's fold raising, memory running
out), is undone (:func:`all_or_nothing`): parameters, buffers, submodules and flags are as they
were.
"""

import contextlib
import copy
import inspect
import itertools
import threading
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import FoldError

# The fold methods of every convention, tried in this order on modules that are not mmrepa's.
FOREIGN_FOLD_METHODS = ('switch_to_deploy', 'reparameterize', 'fuse')


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


def _post_order(module: nn.Module, prefix: str = '') -> Iterator[Tuple[str, nn.Module]]:
    for name, child in module.named_children():
        yield from _post_order(child, f'{prefix}.{name}' if prefix else name)
    yield prefix, module


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
