"""How much a lower precision can move a result: the rounding condition of a computation."""

import torch
from torch.overrides import TorchFunctionMode


class KeepResults(TorchFunctionMode):
    """Keeps every floating tensor an operation makes (not views: no rounding), with its
    gradient."""

    def __init__(self):
        super().__init__()
        self.tensors = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.requires_grad and t._base is None:
                if id(t) not in self.tensors and t.is_floating_point():
                    t.retain_grad()
                    self.tensors[id(t)] = t
        return out


def rounding_condition(fn, model: torch.nn.Module, inputs: torch.Tensor):
    """(``fn(inputs)``, a scalar computed in float64, and kappa = sqrt(sum (dL/dt * t)^2) over
    the model's parameters, the input and every result of an operation of ``fn``): the tensors a
    lower precision rounds. Each rounding moves t by at most u|t|, the scalar by dL/dt times
    that to first order; taken as independent and of mean zero (the probabilistic model of
    Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019), Hoeffding's inequality bounds their sum by
    lambda u kappa except with probability 2 exp(-lambda^2 / 2) (lambda = 5: below 1e-5)."""
    model.zero_grad(set_to_none=True)
    inputs = inputs.detach().requires_grad_()
    inputs.retain_grad()
    with KeepResults() as kept:
        value = fn(inputs)
    value.backward()
    tensors = [inputs, *kept.tensors.values(), *model.parameters()]
    kappa = sum(float((t.grad * t).detach().square().sum()) for t in tensors if t.grad is not None)
    return float(value.detach()), kappa**0.5
