"""RepOptSGD: torch SGD whose loss gradient of each RepOpt kernel is multiplied by its Grad Mult."""

from typing import Optional

import torch
import torch.nn as nn
from mmengine.registry import OPTIMIZERS

from ...errors import ConfigError
from .base import RepOptOptimizer
from .branch_scales import branch_multiplier, compute_dtype


@OPTIMIZERS.register_module()
class RepOptSGD(RepOptOptimizer):
    """SGD with gradient re-parameterization (SPEC-repopt §6.4).

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
        if lr < 0:
            raise ConfigError(f'RepOptSGD: lr must be >= 0, got {lr}')
        if momentum < 0:
            raise ConfigError(f'RepOptSGD: momentum must be >= 0, got {momentum}')
        if weight_decay < 0:
            raise ConfigError(f'RepOptSGD: weight_decay must be >= 0, got {weight_decay}')
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

    @torch.no_grad()
    def step(self, closure=None):
        """One update (see the class docstring); ``closure`` re-evaluates the loss."""
        loss, coef = self._begin_step(closure)
        for group in self.param_groups:
            lr = group['lr']
            momentum = group['momentum']
            dampening = group['dampening']
            weight_decay = group['weight_decay']
            nesterov = group['nesterov']
            decoupled = group.get('decoupled_weight_decay', False)
            for p in group['params']:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError('RepOptSGD does not support sparse gradients')
                g = self._scaled(p.grad, coef)
                m = self.multiplier(p)
                if m is not None:
                    # a new tensor: p.grad keeps the raw gradient (SPEC pitfall 11)
                    g = (g.to(m.dtype) * m).to(p.dtype)
                if weight_decay != 0:
                    if decoupled:
                        p.mul_(1 - lr * weight_decay)
                    else:
                        g = g.add(p, alpha=weight_decay)
                if momentum != 0:
                    state = self.state[p]
                    buf = state.get('momentum_buffer')
                    if buf is None:
                        buf = state['momentum_buffer'] = g.detach().clone()
                    else:
                        buf.mul_(momentum).add_(g, alpha=1 - dampening)
                    g = g.add(buf, alpha=momentum) if nesterov else buf
                p.add_(g, alpha=-lr)
        return loss
