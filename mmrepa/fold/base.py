"""The base of every foldable module: it owns the fold, a subclass says only what folds to what.

:meth:`Reparameterizable.reparameterize` is the one fold every foldable module runs (see
``docs/folding_protocol.md``): refuse training mode and every ``fold_problems()`` of the module
and its descendants before anything changes; fold the descendants, deepest first; compute the
module's own folded tensors in float64 (:meth:`~Reparameterizable._fold_tensors`), refuse them
unless finite in the module's dtype, build the folded form
(:meth:`~Reparameterizable._apply_fold`) and write the tensors into it by state-dict name; set
``deploy``; undo everything if any step raises. The base also owns the load check
(:meth:`~Reparameterizable._load_from_state_dict`): a checkpoint of the other form is refused.

The walk over descendants (:func:`fold_submodules`, by every convention :mod:`.protocol` lists)
lives here too, beside the fold that runs it: :mod:`.protocol` builds on this module, not the
other way round.
"""

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import CheckpointError, FoldError
from .arithmetic import fold_dtype
from .checks import (
    FOREIGN_FOLD_METHODS,
    _callable_without_arguments,
    all_or_nothing,
    check_foldable,
)


@dataclass(frozen=True)
class FoldPolicy:
    """Options of a fold, where a module can fold in more than one exact way.

    ``identity_apart``: keep identity shortcuts out of the weights. RepVGG layers fold into
    ``act(conv(x) + x * s)`` (not ``s`` on the kernel's diagonal centre taps), channel-idle
    FFNs whose pre-norm folds add ``r * x`` after their matrices (not ``diag(r)`` in
    ``in_proj``): one elementwise op more, but weights of ~0.1 no longer share an 8-bit range
    with an identity of ~1 (what INT8 needs, :mod:`mmrepa.integrations.quantize`).
    """

    identity_apart: bool = False


class Reparameterizable:
    """Base (a mixin before :class:`torch.nn.Module`) of every module with a folded form.

    A subclass sets ``deploy`` in ``__init__`` (``True``: build the folded form directly),
    declares ``fold_state_keys = (folded_key, unfolded_key)`` if the two forms have different
    state dicts, may list ``fold_problems()``, and implements two hooks:

    - :meth:`_fold_tensors`: the folded tensors, by their state-dict names in the folded
      form, computed in ``dtype`` (float64) from the unfolded module; changes nothing;
    - :meth:`_apply_fold`: turn the module into its folded structure (drop the training
      layers, create the folded ones, best with the builder ``deploy=True`` uses); the base
      then copies the tensors in.

    It does not override :meth:`reparameterize` (refused at class creation).
    """

    deploy: bool = False
    fold_state_keys: Optional[Tuple[str, str]] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        if nn.Module in mro and mro.index(nn.Module) < mro.index(Reparameterizable):
            raise TypeError(
                f'{cls.__qualname__} lists nn.Module (or a module class) before '
                'Reparameterizable: list Reparameterizable first, or the load check and the '
                'fold never run (docs/folding_protocol.md)'
            )
        if 'reparameterize' in cls.__dict__:
            raise TypeError(
                f'{cls.__qualname__} overrides reparameterize(), which Reparameterizable owns: '
                'implement _fold_tensors() and _apply_fold() instead (docs/folding_protocol.md)'
            )

    # -- what a subclass writes

    def fold_problems(self):
        """Why this module (not its descendants, which answer for themselves) cannot be
        folded as it is, one reason per entry; ``[]`` if it can. Reads only. Training mode is
        checked for every module alike and is not listed here."""
        return []

    def _fold_tensors(self, dtype: torch.dtype, policy: FoldPolicy) -> Dict[str, torch.Tensor]:
        """``{name in the folded state dict: tensor in dtype}``; ``{}``: nothing of its own."""
        return {}

    def _apply_fold(self, tensors: Dict[str, torch.Tensor], policy: FoldPolicy) -> None:
        """Build the folded structure; ``tensors`` (cast to the module's dtype) go in after."""

    # -- what the base does

    def reparameterize(self, policy: Optional[FoldPolicy] = None) -> None:
        """Fold in place by ``policy`` (default: the plain fold), all or nothing; idempotent.
        Raises :class:`FoldError` (one line naming the module) before changing anything if
        a module is in training mode or reports a fold problem."""
        if self.deploy:
            return
        policy = policy or FoldPolicy()
        check_foldable(self)
        with all_or_nothing(self), torch.no_grad():
            fold_submodules(self, policy)
            like = next(itertools.chain(self.parameters(), self.buffers()), None)
            tensors = {}
            if like is not None:
                computed = self._fold_tensors(fold_dtype(like), policy)
                tensors = {k: self._checked_cast(k, t, like) for k, t in computed.items()}
            self._apply_fold(tensors, policy)
            state = dict(itertools.chain(self.named_parameters(), self.named_buffers()))
            for name, value in tensors.items():
                if name not in state:
                    raise FoldError(
                        f'{type(self).__name__}._apply_fold() built no {name} for the folded '
                        'tensor of that name: create it there (or drop it from _fold_tensors)'
                    )
                state[name].copy_(value)
            self.deploy = True

    def _checked_cast(self, name: str, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        # a copy: a computed tensor may be a live parameter (``.to`` of a float64 model
        # returns it), which _apply_fold or writing an earlier tensor would change
        value = value.to(device=like.device, dtype=like.dtype, copy=True)
        if not torch.isfinite(value).all():
            raise FoldError(
                f'the folded {name} of {type(self).__name__} is not finite in {like.dtype} '
                '(NaN or inf): the weights it is computed from are, or it overflows the dtype; '
                'check the checkpoint, or fold in a wider dtype'
            )
        return value

    def check_foldable(self) -> None:
        """Raise :class:`FoldError` if :meth:`reparameterize` would refuse (training mode,
        a problem of this module or a descendant); changes nothing."""
        check_foldable(self)

    def switch_to_deploy(self, policy: Optional[FoldPolicy] = None) -> None:
        """:meth:`reparameterize` under the name mmpretrain's converter, mmyolo-style
        utilities and mmdeploy call. Those callers may not have called ``eval()`` yet (mmdeploy
        folds right after loading the checkpoint), so the fold runs in eval mode, reading the
        BatchNorm running statistics as ``reparameterize`` does, and every module gets its
        training flag back afterwards."""
        modes = {module: module.training for module in self.modules()}
        self.eval()
        try:
            self.reparameterize(policy)
        finally:

            def restore(module, inherited):  # a module the fold created takes its parent's
                module.training = modes.get(module, inherited)
                for child in module.children():
                    restore(child, module.training)

            restore(self, modes[self])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # every load path (load_state_dict, mmengine's load_checkpoint for load_from, resume,
        # tools/test.py) passes here: the other form is refused, not loaded as missing keys
        check_fold_state(state_dict, prefix, self)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def check_fold_state(state_dict: dict, prefix: str, module: nn.Module) -> None:
    """Refuse to load the other form of a module's weights: ``module.fold_state_keys =
    (folded_key, unfolded_key)`` are keys only its folded and only its unfolded state dict
    have (nothing to check without them)."""
    keys = getattr(module, 'fold_state_keys', None)
    if not keys:
        return
    folded_key, unfolded_key = keys
    has_folded = prefix + folded_key in state_dict
    has_unfolded = prefix + unfolded_key in state_dict
    where = prefix[:-1] or type(module).__name__
    if module.deploy and has_unfolded and not has_folded:
        raise CheckpointError(
            f'{where}: the checkpoint holds unfolded weights ({prefix}{unfolded_key}) but '
            f'the model was built folded (deploy=True). Build it with deploy=False and fold after '
            f'loading, or fold the checkpoint first with tools/reparameterize.py.'
        )
    if not module.deploy and has_folded and not has_unfolded:
        raise CheckpointError(
            f'{where}: the checkpoint holds folded weights ({prefix}{folded_key}), written '
            f'by reparameterize, but the model was built unfolded. Build it with deploy=True '
            f'(for a config: --cfg-options model.backbone.deploy=True).'
        )


def check_fold_states(model: nn.Module, state_dict: dict) -> None:
    """:func:`check_fold_state` for every submodule of ``model`` (``state_dict`` in
    ``model``'s names) at once: a loader that accounts for missing keys before loading calls
    this first, so the other form is named as such rather than as missing keys."""
    for name, module in model.named_modules():
        check_fold_state(state_dict, f'{name}.' if name else '', module)


# -- the walk: folds descendants deepest first, mmrepa's way or a foreign convention


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
