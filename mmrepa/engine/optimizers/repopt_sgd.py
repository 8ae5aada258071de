"""RepOptSGD: torch SGD whose loss gradient of each RepOpt kernel is multiplied by its Grad Mult."""

from typing import List, Optional

import torch
import torch.nn as nn
from mmengine.registry import OPTIMIZERS
from torch.optim.sgd import sgd

from ...errors import ConfigError
from .base import RepOptOptimizer, check_nonnegative
from .branch_scales import branch_multiplier, compute_dtype


@OPTIMIZERS.register_module()
class RepOptSGD(RepOptOptimizer):
    """SGD with gradient re-parameterization (the RepOptimizers paper's Rule of Iteration, §3.2
    Eq. 2, proved in its appendix A).

    For a RepOpt kernel ``W'`` with multiplier ``M = sum_k alpha_k**2`` (float32, or float64
    for float64 parameters), per step::

        g~ = M * dL/dW'                    # the loss gradient only (after clipping, if any)
        d  = g~ + weight_decay * W'        # coupled L2, never multiplied
        b  = d  (first step)  |  momentum * b + (1 - dampening) * d
        u  = d + momentum * b  if nesterov else b
        W' = W' - lr * u

    which is exactly SGD on every parameter of the imaginary CSLA block (all its branches with
    the same lr, momentum and decay, the identity scale included). Every other parameter is
    updated bit for bit like ``torch.optim.SGD`` (single-tensor path), and the state
    (``momentum_buffer``) has torch's layout, so ``state_dict()`` round-trips and a plain SGD
    checkpoint loads. ``p.grad`` is never modified.

    The multipliers come from :meth:`attach_branch_scales` (done by
    ``RepOptOptimWrapperConstructor``); stepping without attaching is an error.

    Args:
        params: Parameters or parameter groups.
        lr (float): Learning rate. Default: 1e-3.
        momentum (float): Default: 0.
        dampening (float): Default: 0.
        weight_decay (float): Default: 0.
        nesterov (bool): Default: False (needs momentum > 0 and dampening = 0, as in torch).
        decoupled_weight_decay (bool): Instead of the coupled L2 term, shrink
            ``W <- W * (1 - lr * weight_decay)`` before the update (SGDW). Also exact for the
            CSLA. Default: False.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        decoupled_weight_decay: bool = False,
    ):
        check_nonnegative('RepOptSGD', lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ConfigError(
                'RepOptSGD: nesterov=True needs momentum > 0 and dampening = 0 '
                f'(got momentum={momentum}, dampening={dampening})'
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            decoupled_weight_decay=decoupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _prepare_scales(self, param: nn.Parameter, scales: torch.Tensor) -> torch.Tensor:
        # SGD needs M only: keep one kernel-sized tensor instead of K
        return branch_multiplier(scales, compute_dtype(param.dtype, scales.dtype))

    def multiplier(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        return self._stored(p)

    def _step_group(
        self, group: dict, params: List[nn.Parameter], grads: List[torch.Tensor]
    ) -> None:
        """torch's own functional SGD does the update on the multiplied gradients, so every
        parameter follows ``torch.optim.SGD`` by construction. Its single-tensor path
        (``foreach=False``): the multi-tensor one adds the momentum into the gradients in
        place with nesterov, and ``p.grad`` must keep the raw gradient."""
        lr, weight_decay = group['lr'], group['weight_decay']
        if weight_decay != 0 and group.get('decoupled_weight_decay', False):
            for p in params:
                p.mul_(1 - lr * weight_decay)
            weight_decay = 0.0
        buffers = [self.state[p].get('momentum_buffer') for p in params]
        sgd(
            params,
            [self._multiplied(p, g) for p, g in zip(params, grads)],
            buffers,
            foreach=False,
            weight_decay=weight_decay,
            momentum=group['momentum'],
            lr=lr,
            dampening=group['dampening'],
            nesterov=group['nesterov'],
            maximize=False,
        )
        if group['momentum'] != 0:
            for p, buf in zip(params, buffers):
                self.state[p]['momentum_buffer'] = buf

    def _multiplied(self, p: nn.Parameter, g: torch.Tensor) -> torch.Tensor:
        """``M * g`` for a RepOpt kernel (a new tensor), ``g`` for any other parameter."""
        m = self.multiplier(p)
        return g if m is None else (g.to(m.dtype) * m).to(p.dtype)
