"""RepOptAdamW: AdamW that reproduces AdamW on the imaginary CSLA block branch by branch."""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.registry import OPTIMIZERS
from torch.optim.adamw import adamw

from ...errors import ConfigError
from .base import RepOptOptimizer, check_nonnegative
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
    ``state_dict()`` round-trips. torch's functional ``adamw`` (single-tensor path) computes
    every update: parameters without scales are updated by it as ``torch.optim.AdamW`` does,
    and each term of the sum is its step of one branch. ``amsgrad`` is exact too: the running
    maximum of ``alpha_k**2 * v`` is ``alpha_k**2`` times that of ``v``. ``p.grad`` is never
    modified.

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
        check_nonnegative('RepOptAdamW', lr=lr, eps=eps, weight_decay=weight_decay)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ConfigError(f'RepOptAdamW: betas must lie in [0, 1), got {betas}')
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

    def _step_group(
        self, group: dict, params: List[nn.Parameter], grads: List[torch.Tensor]
    ) -> None:
        """torch's functional AdamW (single-tensor path) does every update: it moves the
        parameters without scales and advances the moments of all of them. A RepOpt kernel's
        own entry moves a zero stand-in (its moments advance; the move is dropped): the kernel
        moves by :meth:`_kernel_move`, from the moments before this step, and decays. Kernels
        go one at a time, so the temporaries are one kernel's, not the model's."""
        states = [self._state(p, group['amsgrad']) for p in params]
        plain = [i for i, p in enumerate(params) if self._stored(p) is None]
        if plain:
            _adamw(group, *([seq[i] for i in plain] for seq in (params, grads, states)))
        lr, weight_decay = group['lr'], group['weight_decay']
        for p, g, state in zip(params, grads, states):
            if self._stored(p) is None:
                continue
            move = self._kernel_move(p, g, state, group)
            _adamw(group, [torch.zeros_like(p)], [g], [state])
            if weight_decay != 0:
                p.mul_(1 - lr * weight_decay)  # decoupled, unmultiplied, as torch decays
            p.add_(move.to(p.dtype))

    def _state(self, p: nn.Parameter, amsgrad: bool) -> dict:
        """``p``'s state, created as torch's AdamW creates it (a float32 step tensor), so the
        states are interchangeable."""
        state = self.state[p]
        if not state:
            state['step'] = torch.tensor(0.0, dtype=torch.float32)
            state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if amsgrad:
                state['max_exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def _kernel_move(
        self, p: nn.Parameter, grad: torch.Tensor, state: dict, group: dict
    ) -> torch.Tensor:
        """How AdamW on the CSLA branches moves ``W' = Σ_k alpha_k W_k``, decay aside:
        ``Σ_k alpha_k Δ_k``, where ``Δ_k`` is torch's AdamW step (no decay) of branch ``k``
        from zero, with gradient ``alpha_k g`` and moments ``alpha_k m``, ``alpha_k² v`` (the
        branch's own, derived from the kernel's), computed in the scales' dtype."""
        a = self._stored(p)
        if group.get('mode', 'exact') == 'official':
            a = a.sum(0, keepdim=True)  # one branch with the signed sum M1
        g = grad.to(a.dtype)
        m, v = state['exp_avg'].to(a.dtype), state['exp_avg_sq'].to(a.dtype)
        squares = [alpha * alpha for alpha in a]
        branches = dict(
            exp_avg=[alpha * m for alpha in a],
            exp_avg_sq=[sq * v for sq in squares],
            step=[state['step'].clone() for _ in a],
        )
        if group['amsgrad']:
            v_max = state['max_exp_avg_sq'].to(a.dtype)
            branches['max_exp_avg_sq'] = [sq * v_max for sq in squares]
        deltas = [torch.zeros_like(g) for _ in a]
        _adamw(
            dict(group, weight_decay=0.0),
            deltas,
            [alpha * g for alpha in a],
            [{k: branches[k][i] for k in branches} for i in range(len(a))],
        )
        move = torch.zeros_like(g)
        for alpha, delta in zip(a, deltas):
            # a branch that does not cover an entry moves it by exactly 0 (no 0/0 when eps = 0)
            move += torch.where(alpha != 0, alpha * delta, torch.zeros_like(delta))
        return move


def _adamw(
    group: dict, params: List[torch.Tensor], grads: List[torch.Tensor], states: List[dict]
) -> None:
    """torch's functional AdamW, single-tensor path, with ``group``'s hyper-parameters."""
    beta1, beta2 = group['betas']
    adamw(
        params,
        grads,
        [st['exp_avg'] for st in states],
        [st['exp_avg_sq'] for st in states],
        [st['max_exp_avg_sq'] for st in states] if group['amsgrad'] else [],
        [st['step'] for st in states],
        foreach=False,
        amsgrad=group['amsgrad'],
        beta1=beta1,
        beta2=beta2,
        lr=group['lr'],
        weight_decay=group['weight_decay'],
        eps=group['eps'],
        maximize=False,
    )
