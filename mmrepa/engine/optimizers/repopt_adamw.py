"""RepOptAdamW: AdamW that reproduces AdamW on the imaginary CSLA block branch by branch."""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.registry import OPTIMIZERS

from ...errors import ConfigError
from .base import RepOptOptimizer
from .branch_scales import branch_multiplier, compute_dtype

_MODES = ('exact', 'official')


@OPTIMIZERS.register_module()
class RepOptAdamW(RepOptOptimizer):
    """AdamW with gradient re-parameterization: the RepOptimizers paper's CSLA = GR (§3.2)
    carried over to AdamW (docs/backbones/repopt_vgg.md, Optimizers).

    A CSLA branch ``k`` with constant scale ``alpha_k`` feeds each kernel entry one-to-one,
    so its Adam moments are ``alpha_k * m`` and ``alpha_k**2 * v``, where ``m``, ``v`` are the
    moments of the raw kernel gradient. AdamW on every branch therefore moves ``W'`` by::

        W' <- W' * (1 - lr * weight_decay)                 # decoupled, unmultiplied
        W' <- W' - lr * sum_k alpha_k**2 * m^ / (|alpha_k| * sqrt(v^) + eps)

    (``m^``, ``v^`` bias-corrected; the sum runs over the, at most 3, branches covering an
    entry: terms with ``alpha_k = 0`` vanish). The moments are kept on the raw gradient in
    torch's state layout (``step``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``), so
    ``state_dict()`` round-trips and parameters without scales are updated bit for bit like
    ``torch.optim.AdamW`` (single-tensor path). ``amsgrad`` is exact too: the running maximum
    of ``alpha_k**2 * v`` is ``alpha_k**2`` times that of ``v``. ``p.grad`` is never modified.

    Args:
        params: Parameters or parameter groups.
        lr (float): Default: 1e-3.
        betas (tuple[float, float]): Default: (0.9, 0.999).
        eps (float): Default: 1e-8.
        weight_decay (float): Decoupled decay. Default: 1e-2 (torch's AdamW default).
        amsgrad (bool): Default: False.
        mode (str): ``'exact'`` (default) the per-branch rule above; ``'official'`` the
            released RepOptimizers rule, a single branch with the signed sum
            ``M1 = sum_k alpha_k`` (``-lr * M1**2 m^ / (|M1| sqrt(v^) + eps)``): exact on
            off-centre taps only, off at centre taps whose scales have mixed signs. Kept to
            reproduce that code, not for new runs.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        mode: str = 'exact',
    ):
        if lr < 0:
            raise ConfigError(f'RepOptAdamW: lr must be >= 0, got {lr}')
        if eps < 0:
            raise ConfigError(f'RepOptAdamW: eps must be >= 0, got {eps}')
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ConfigError(f'RepOptAdamW: betas must lie in [0, 1), got {betas}')
        if weight_decay < 0:
            raise ConfigError(f'RepOptAdamW: weight_decay must be >= 0, got {weight_decay}')
        if mode not in _MODES:
            raise ConfigError(f'RepOptAdamW: mode must be one of {_MODES}, got {mode!r}')
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            mode=mode,
        )
        super().__init__(params, defaults)

    def _prepare_scales(self, param: nn.Parameter, scales: torch.Tensor) -> torch.Tensor:
        # the per-branch magnitudes are needed, not only their squares: keep A
        return scales.to(compute_dtype(param.dtype, scales.dtype))

    def multiplier(self, p: nn.Parameter) -> Optional[torch.Tensor]:
        a = self._stored(p)
        return None if a is None else branch_multiplier(a, a.dtype)

    @torch.no_grad()
    def step(self, closure=None):
        """One update (see the class docstring); ``closure`` re-evaluates the loss."""
        loss, coef = self._begin_step(closure)
        for group in self.param_groups:
            lr = group['lr']
            beta1, beta2 = group['betas']
            eps = group['eps']
            weight_decay = group['weight_decay']
            amsgrad = group['amsgrad']
            official = group.get('mode', 'exact') == 'official'
            for p in group['params']:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError('RepOptAdamW does not support sparse gradients')
                grad = self._scaled(p.grad, coef)
                state = self.state[p]
                if not state:
                    # torch's layout (a float32 step tensor), so the states are interchangeable
                    state['step'] = torch.tensor(0.0, dtype=torch.float32)
                    state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if amsgrad:
                        state['max_exp_avg_sq'] = torch.zeros_like(
                            p, memory_format=torch.preserve_format
                        )
                exp_avg, exp_avg_sq = state['exp_avg'], state['exp_avg_sq']
                state['step'] += 1
                step = state['step'].item()

                if weight_decay != 0:
                    p.mul_(1 - lr * weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias_correction1 = 1 - beta1**step
                bias_correction2_sqrt = (1 - beta2**step) ** 0.5
                step_size = lr / bias_correction1
                if amsgrad:
                    v = state['max_exp_avg_sq']
                    torch.maximum(v, exp_avg_sq, out=v)
                else:
                    v = exp_avg_sq

                a = self._stored(p)
                if a is None:
                    denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
                    p.addcdiv_(exp_avg, denom, value=-step_size)
                    continue
                if official:
                    a = a.sum(0, keepdim=True)
                m = exp_avg.to(a.dtype)
                root_v = v.to(a.dtype).sqrt() / bias_correction2_sqrt
                update = torch.zeros_like(m)
                for alpha in a:
                    term = m * (alpha * alpha) / (alpha.abs() * root_v + eps)
                    # a branch that does not cover an entry contributes exactly 0 (and no
                    # 0/0 when eps = 0)
                    update += torch.where(alpha != 0, term, torch.zeros_like(term))
                p.add_(update.to(p.dtype), alpha=-step_size)
        return loss
