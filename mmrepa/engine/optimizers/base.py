"""What the RepOpt optimizers share: the attached branch scales of the RepOpt kernels and the
exact CSLA-norm gradient clipping."""

import math
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub
from torch.optim import Optimizer

from ...errors import ConfigError
from .branch_scales import BranchScales, check_branch_scales, compute_dtype


def check_nonnegative(owner: str, **values: float) -> None:
    """Refuse the first negative hyper-parameter of ``owner``, named, in the order given."""
    for name, value in values.items():
        if value < 0:
            raise ConfigError(f'{owner}: {name} must be >= 0, got {value}')


class RepOptOptimizer(Optimizer):
    """Base of :class:`RepOptSGD` and :class:`RepOptAdamW`.

    The branch scales are attached after construction (:meth:`attach_branch_scales`, done by
    ``RepOptOptimWrapperConstructor``) and are deliberately **not** part of ``state_dict()``:
    they are rebuilt from the model (whose layers keep the scales as buffers) whenever the
    optimizer is built, so resuming loads exactly the torch-style state (momentum buffers, Adam
    moments) and a checkpoint does not carry a copy of every kernel.

    A RepOpt optimizer never modifies ``p.grad``: the multiplier and the clipping act on a copy
    inside :meth:`step`, i.e. after DDP averaging, gradient accumulation and AMP unscaling
    (``GradScaler.step`` unscales before it calls ``step``).

    Sharded training gives each rank pieces of the kernels: ``FoldableFSDPStrategy`` attaches
    the matching slices of the scales and :meth:`set_shard_group`; nothing here knows FSDP.

    Subclasses keep what they need of the scales (:meth:`_prepare_scales`), say what the SGD
    multiplier is (:meth:`multiplier`) and update one parameter group (:meth:`_step_group`);
    :meth:`step` does the rest.
    """

    def __init__(self, params, defaults: dict):
        super().__init__(params, defaults)
        # None = not attached yet (an error at step); {} = attached, no RepOpt kernel
        self._repopt: Optional[Dict[nn.Parameter, torch.Tensor]] = None
        self._scale_source: Optional[Callable[[], BranchScales]] = None
        self._scale_names: Dict[nn.Parameter, str] = {}
        self.csla_clip: Optional[dict] = None
        self.shard_group = None

    def __setstate__(self, state: dict) -> None:
        # torch pickles (and deep-copies) defaults, state and param_groups only: a copy must
        # be re-attached, and says so at its first step instead of training without multipliers
        super().__setstate__(state)
        self.__dict__.setdefault('_repopt', None)
        self.__dict__.setdefault('_scale_source', None)
        self.__dict__.setdefault('_scale_names', {})
        self.__dict__.setdefault('csla_clip', None)
        self.__dict__.setdefault('shard_group', None)

    # --- branch scales ------------------------------------------------------------------------

    def attach_branch_scales(
        self,
        scales: BranchScales,
        names: Optional[Dict[nn.Parameter, str]] = None,
        source: Optional[Callable[[], BranchScales]] = None,
    ) -> None:
        """Attach the branch scales of the RepOpt kernels (replacing earlier ones).

        Args:
            scales: ``{kernel: A}`` with ``A`` of shape ``(K, *kernel.shape)``
                (:func:`collect_branch_scales`). Every kernel must be in this optimizer's
                parameter groups. ``{}`` makes the optimizer plain SGD / AdamW on purpose.
            names: Parameter names for error messages.
            source: Gives the scales again; they are rebuilt from it once, at the first
                :meth:`step`. mmengine's Runner builds the optimizer before ``init_weights``,
                ``load_from`` and resume, which may bring the constants (the layers' buffers)
                of a pretrained or resumed model: the first step sees those.
        """
        names = names or {}
        self._scale_source, self._scale_names = source, names
        in_groups = {p for group in self.param_groups for p in group['params']}
        stored: Dict[nn.Parameter, torch.Tensor] = {}
        for p, a in scales.items():
            name = names.get(p, f'kernel of shape {tuple(p.shape)}')
            check_branch_scales(p, a, name)
            if p not in in_groups:
                raise ValueError(
                    f'RepOpt kernel {name!r} is not in any parameter group of '
                    f'{type(self).__name__}: build the optimizer over the same '
                    'parameter objects (not a copy, not FSDP-flattened; under sharding, '
                    "FoldableFSDPStrategy attaches the scales of each rank's pieces)"
                )
            stored[p] = self._prepare_scales(p, a.detach().to(p.device))
        self._repopt = stored

    def _refresh_scales(self) -> None:
        """Rebuild the scales from their source if the first step has not done so yet."""
        if self._scale_source is not None:
            source, names = self._scale_source, self._scale_names
            self.attach_branch_scales(source(), names)

    def _prepare_scales(self, param: nn.Parameter, scales: torch.Tensor) -> torch.Tensor:
        """What to keep per kernel (the subclass decides: ``M`` for SGD, ``A`` for AdamW)."""
        raise NotImplementedError

    @property
    def repopt_params(self) -> Tuple[nn.Parameter, ...]:
        """The kernels that have a multiplier (empty before :meth:`attach_branch_scales`)."""
        return tuple(self._repopt or ())

    def _stored(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        """The kept tensor of ``p`` on its device and in its compute dtype, or None."""
        if self._repopt is None:
            raise RuntimeError(
                f'{type(self).__name__} has no branch scales attached, so it would silently '
                'train without gradient multipliers. Build it with optim_wrapper=dict('
                "constructor='RepOptOptimWrapperConstructor', ...) or call "
                'optimizer.attach_branch_scales(collect_branch_scales(model)) '
                '(attach {} to train without multipliers on purpose)'
            )
        t = self._repopt.get(p)
        if t is None:
            return None
        dtype = compute_dtype(p.dtype, t.dtype)
        if t.device != p.device or t.dtype != dtype:
            # the model moved (or was widened) after the optimizer was built: convert once
            t = self._repopt[p] = t.to(p.device, dtype)
        return t

    def multiplier(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        """The SGD multiplier ``M = sum_k alpha_k**2`` of ``p`` (None for a plain parameter)."""
        raise NotImplementedError

    # --- CSLA-norm clipping -------------------------------------------------------------------

    def set_csla_clip(
        self, max_norm: Optional[float], norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> None:
        """Clip the gradients by the CSLA model's gradient norm inside :meth:`step`.

        ``||grad_theta L||^2 = sum M * g**2`` over the RepOpt kernels ``+ sum g**2`` over the
        other parameters (every parameter of the optimizer that has a gradient), so scaling
        the raw gradients by ``min(1, max_norm / (norm + 1e-6))`` before the multiplier is
        exactly ``torch.nn.utils.clip_grad_norm_`` on the imaginary CSLA model. ``p.grad`` is
        not changed. ``None`` turns clipping off.

        Args:
            max_norm: Max CSLA gradient norm.
            norm_type: Only 2: the identity above holds for the Euclidean norm only.
            error_if_nonfinite: Raise if the norm is inf or nan (as torch does).
        """
        if max_norm is None:
            self.csla_clip = None
            return
        if float(norm_type) != 2.0:
            raise ConfigError(
                f'csla clipping supports norm_type=2 only, got {norm_type!r}: the '
                "CSLA model's gradient norm is computable from the plain model for "
                'the Euclidean norm only; drop norm_type'
            )
        if not max_norm > 0:
            raise ConfigError(f'csla clipping needs max_norm > 0, got {max_norm!r}')
        self.csla_clip = dict(max_norm=float(max_norm), error_if_nonfinite=bool(error_if_nonfinite))

    def set_shard_group(self, group) -> None:
        """Say that the parameters are pieces of tensors split over the ranks of the process
        ``group`` (sharded training; the scales attached are those of the pieces): the CSLA
        gradient norm then sums over the ranks. ``None``: each rank holds whole tensors."""
        self.shard_group = group

    def _group_params(self, group: dict) -> List[nn.Parameter]:
        """The parameters of ``group`` that have a gradient; a sparse gradient is refused."""
        params = [p for p in group['params'] if p.grad is not None]
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError(f'{type(self).__name__} does not support sparse gradients')
        return params

    def _params_with_grad(self) -> Iterator[nn.Parameter]:
        for group in self.param_groups:
            yield from self._group_params(group)

    @torch.no_grad()
    def csla_grad_norm(self) -> torch.Tensor:
        """The gradient norm of the CSLA model (see :meth:`set_csla_clip`), a 0-dim tensor."""
        squares = []
        # the sum's dtype from every parameter and multiplier, not from those with a gradient:
        # under sharding every rank must all-reduce the same dtype, one with no piece too
        dtypes = [p.dtype for group in self.param_groups for p in group['params']]
        dtypes += [t.dtype for t in (self._repopt or {}).values()]
        for p in self._params_with_grad():
            m = self.multiplier(p)
            g = p.grad.to(compute_dtype(p.grad.dtype, m.dtype if m is not None else p.dtype))
            squares.append((g * g * m).sum() if m is not None else (g * g).sum())
        dtype = compute_dtype(*dtypes)
        device = squares[0].device if squares else self.param_groups[0]['params'][0].device
        total = torch.stack(
            [s.to(device, dtype) for s in squares] or [torch.zeros((), dtype=dtype, device=device)]
        ).sum()
        if self.shard_group is not None:
            dist.all_reduce(total, group=self.shard_group)
        return total.sqrt()

    def _clip_coef(self) -> Optional[torch.Tensor]:
        """The factor of every raw gradient at this step (None: no clipping). Called first in
        every step: it also rebuilds pending scales (:meth:`attach_branch_scales`)."""
        self._refresh_scales()
        if self.csla_clip is None:
            return None
        norm = self.csla_grad_norm()
        if self.csla_clip['error_if_nonfinite'] and not bool(torch.isfinite(norm)):
            raise RuntimeError(
                f'the CSLA gradient norm is {norm.item()}: the gradients '
                'contain inf or nan (error_if_nonfinite=True)'
            )
        # log like OptimWrapper's clipping does, so grad_norm shows up in the training log
        norm_value = norm.item()
        if not math.isnan(norm_value):
            MessageHub.get_current_instance().update_scalar('train/grad_norm', norm_value)
        # torch.nn.utils.clip_grad_norm_'s formula, to match clipped CSLA training exactly
        return torch.clamp(self.csla_clip['max_norm'] / (norm + 1e-6), max=1.0)

    @staticmethod
    def _scaled(g: torch.Tensor, coef: Optional[torch.Tensor]) -> torch.Tensor:
        return g if coef is None else g * coef.to(g.device, g.dtype)

    # --- the step -----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """One update (see the subclass's docstring); ``closure`` re-evaluates the loss.

        Each group's parameters that have a gradient are updated from their raw gradients
        after the CSLA-norm clipping (new tensors: ``p.grad`` is left alone)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        coef = self._clip_coef()
        for group in self.param_groups:
            params = self._group_params(group)
            if params:
                self._step_group(group, params, [self._scaled(p.grad, coef) for p in params])
        return loss

    def _step_group(
        self, group: dict, params: List[nn.Parameter], grads: List[torch.Tensor]
    ) -> None:
        """Update ``params`` (those of ``group`` with a gradient) from ``grads``, their raw
        gradients after clipping; a gradient may be ``p.grad`` itself, not to be written."""
        raise NotImplementedError
