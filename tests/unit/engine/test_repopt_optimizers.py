"""RepOptimizers (gradient re-parameterization), float64 on the CPU.

A tiny reference CSLA model (per layer ``ReLU(BN(s * conv3x3(x; K) + t * conv1x1(x; P) + i * x))``
with constant ``s``, ``t`` and trainable ``K``, ``P``, ``i``) is trained with torch's optimizers,
and a plain "target" model (one 3x3 kernel per layer, initialised to the CSLA's equivalent
kernel) with RepOptSGD / RepOptAdamW built by RepOptOptimWrapperConstructor. The two must stay
equal to rounding, and the known ways of getting it wrong (docs/backbones/repopt_vgg.md,
Optimizers) must not.
"""

import copy
import io
import math
import os
import os.path as osp
import socket
from typing import Dict, List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper, build_optim_wrapper

from mmrepa.engine.optimizers import (
    RepOptAdamW,
    RepOptSGD,
    branch_multiplier,
    collect_branch_scales,
)
from mmrepa.errors import ConfigError

DT = torch.float64
# float64 RepOpt steps against the CSLA network's: u64 = 2^-53 ≈ 1.1e-16 times a size factor of
# ~10^4 (STEPS steps of sums over the batch and 9·C-term conv reductions, taken in two orders),
# relative to the largest entry; a missing or misplaced multiplier is off by 1e-3 or more
TOL = 1e-12
C, C2, NUM_CLASSES = 4, 5, 3
STEPS = 12
# (C_in, C_out, stride, identity): a stride-1 layer with identity, a stride-2 layer without
LAYERS = ((C, C, 1, True), (C, C2, 2, False))


@pytest.fixture(scope='module', autouse=True)
def _one_thread():
    # tiny tensors: a second OpenMP thread only spins against the other jobs on the machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel(a, b) -> float:
    """Max relative difference (to the largest entry of ``b``) over tensors or lists of them."""
    if isinstance(a, (list, tuple)):
        return max(rel(x, y) for x, y in zip(a, b))
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def make_scales(cout: int, seed: int):
    """Mixed-sign scales with exact zeros, float32-representable (the interface is float32)."""
    g = torch.Generator().manual_seed(seed)
    s, t = torch.randn(2, cout, generator=g, dtype=DT)
    s[1] = 0.0
    t[0] = 0.0
    s[2], t[2] = abs(s[2]) + 0.5, -abs(t[2]) - 0.5  # a channel with s * t < 0
    return s.float().to(DT), t.float().to(DT)


# --- the reference CSLA layer and the target layer ---------------------------------------------


class CSLALayer(nn.Module):
    """ReLU(BN(s * conv3x3(x; K) + t * conv1x1(x; P) + i * x)), scales along output channels.

    ``s`` and ``t`` are constants (buffers); ``trainable_scales=True`` makes them parameters
    (the Hyper-Search model, which is *not* equivalent to anything GR trains)."""

    def __init__(self, cin, cout, stride, identity, seed, trainable_scales=False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.stride = stride
        self.kernel = nn.Parameter(torch.randn(cout, cin, 3, 3, generator=g, dtype=DT) * 0.3)
        self.point = nn.Parameter(torch.randn(cout, cin, 1, 1, generator=g, dtype=DT) * 0.3)
        self.identity = (
            nn.Parameter(1 + 0.3 * torch.randn(cout, generator=g, dtype=DT)) if identity else None
        )
        s, t = make_scales(cout, seed + 1)
        if trainable_scales:
            self.s, self.t = nn.Parameter(s), nn.Parameter(t)
        else:
            self.register_buffer('s', s)
            self.register_buffer('t', t)
        self.bn = nn.BatchNorm2d(cout).to(DT)
        with torch.no_grad():
            self.bn.weight.copy_(1 + 0.2 * torch.randn(cout, generator=g, dtype=DT))
            self.bn.bias.copy_(0.1 * torch.randn(cout, generator=g, dtype=DT))

    def forward(self, x):
        y = self.s.view(1, -1, 1, 1) * F.conv2d(
            x, self.kernel, stride=self.stride, padding=1
        ) + self.t.view(1, -1, 1, 1) * F.conv2d(x, self.point, stride=self.stride)
        if self.identity is not None:
            y = y + self.identity.view(1, -1, 1, 1) * x
        return F.relu(self.bn(y))

    def equivalent_kernel(self, kernel=None, point=None, identity=None):
        """W' = s * K + centre(t * P) + diag_centre(i) (differentiable in K, P, i)."""
        kernel = self.kernel if kernel is None else kernel
        point = self.point if point is None else point
        identity = self.identity if identity is None else identity
        w = self.s.view(-1, 1, 1, 1) * kernel + F.pad(
            self.t.view(-1, 1, 1, 1) * point, (1, 1, 1, 1)
        )
        if identity is not None:
            w = w + F.pad(torch.diag(identity).view(*w.shape[:2], 1, 1), (1, 1, 1, 1))
        return w


class TargetLayer(nn.Module):
    """ReLU(BN(conv3x3(x; W'))) with ``repopt_branch_scales()`` (the fixed interface)."""

    def __init__(self, cin, cout, stride, identity, s, t, norm=True):
        super().__init__()
        self.stride = stride
        self.has_identity = identity
        self.weight = nn.Parameter(torch.zeros(cout, cin, 3, 3, dtype=DT))
        self.register_buffer('s', s.float())
        self.register_buffer('t', t.float())
        self.bn = nn.BatchNorm2d(cout).to(DT) if norm else nn.Identity()

    def repopt_branch_scales(self) -> Dict[nn.Parameter, torch.Tensor]:
        cout, cin = self.weight.shape[:2]
        a = torch.zeros(
            3 if self.has_identity else 2,
            cout,
            cin,
            3,
            3,
            dtype=torch.float32,
            device=self.weight.device,
        )
        a[0] = self.s.view(-1, 1, 1, 1)
        a[1, :, :, 1, 1] = self.t.view(-1, 1)
        if self.has_identity:
            idx = torch.arange(cout)
            a[2, idx, idx, 1, 1] = 1.0  # the identity branch adds exactly 1 (the paper's Eq. 3)
        return {self.weight: a}

    def forward(self, x):
        return F.relu(self.bn(F.conv2d(x, self.weight, stride=self.stride, padding=1)))


class Net(nn.Module):
    def __init__(self, layers: List[nn.Module]):
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(
            layers[-1].weight.shape[0]
            if hasattr(layers[-1], 'weight')
            else layers[-1].kernel.shape[0],
            NUM_CLASSES,
        ).to(DT)

    def forward(self, x):
        return self.fc(self.layers(x).mean((2, 3)))


def make_csla(seed=0, trainable_scales=False) -> Net:
    net = Net(
        [
            CSLALayer(*spec, seed=seed + 10 * j, trainable_scales=trainable_scales)
            for j, spec in enumerate(LAYERS)
        ]
    )
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 99)
        net.fc.weight.copy_(torch.randn(net.fc.weight.shape, generator=g, dtype=DT) * 0.5)
        net.fc.bias.copy_(torch.randn(net.fc.bias.shape, generator=g, dtype=DT) * 0.1)
    return net


def make_target(csla: Net, reinit=True, norm=True) -> Net:
    """The target model, initialised from ``csla`` by the rule of initialization (Eq. 4)."""
    layers = [
        TargetLayer(*spec, s=c.s.detach(), t=c.t.detach(), norm=norm)
        for spec, c in zip(LAYERS, csla.layers)
    ]
    net = Net(layers)
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for lt, lc in zip(net.layers, csla.layers):
            lt.weight.copy_(
                lc.equivalent_kernel()
                if reinit
                else torch.randn(lt.weight.shape, generator=g, dtype=DT) * 0.3
            )
            if norm:
                lt.bn.load_state_dict(lc.bn.state_dict())
        net.fc.load_state_dict(csla.fc.state_dict())
    return net


def batches(n, batch=6, size=(7, 9), seed=5):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, C, *size, generator=g, dtype=DT),
            torch.randint(NUM_CLASSES, (batch,), generator=g),
        )
        for _ in range(n)
    ]


def cosine(step, base):
    return base * 0.5 * (1 + math.cos(math.pi * step / STEPS))


def train(net, wrapper, base_lr, accumulate=1, steps=STEPS, before_step=None, data=None):
    """``steps`` optimizer steps with a cosine lr; the logits of every forward."""
    data = data or batches(steps * accumulate)
    logits = []
    for i, (x, y) in enumerate(data[: steps * accumulate]):
        if i % accumulate == 0:
            for group in wrapper.param_groups:
                group['lr'] = cosine(i // accumulate, base_lr)
        out = net(x)
        logits.append(out.detach())
        # OptimWrapper.update_params, with a place to meddle before the step
        wrapper.backward(wrapper.scale_loss(F.cross_entropy(out, y)))
        if wrapper.should_update():
            if before_step is not None:
                before_step()
            wrapper.step()
            wrapper.zero_grad()
    return logits


def compare(csla, target, logits_c, logits_t) -> float:
    """Max relative error over the logits of every step and the final weights and statistics."""
    errs = [
        rel(logits_t, logits_c),
        rel(target.fc.weight, csla.fc.weight),
        rel(target.fc.bias, csla.fc.bias),
    ]
    with torch.no_grad():
        for lt, lc in zip(target.layers, csla.layers):
            errs.append(rel(lt.weight, lc.equivalent_kernel()))
            for k, v in lc.bn.state_dict().items():
                if v.is_floating_point():
                    errs.append(rel(lt.bn.state_dict()[k], v))
    return max(errs)


def csla_groups(net: Net, decay_identity=True):
    """Decay on the CSLA kernels, the identity scales and the FC weight; none on BN and bias."""
    decay, no_decay = [], []
    for name, p in net.named_parameters():
        plain_flat = name.startswith('fc.bias') or '.bn.' in name
        if name.endswith('identity') and not decay_identity:
            plain_flat = True
        (no_decay if plain_flat else decay).append(p)
    return [dict(params=decay), dict(params=no_decay, weight_decay=0.0)]


def target_wrapper(net, optimizer: dict, accumulate=1, **extra):
    cfg = dict(
        constructor='RepOptOptimWrapperConstructor',
        optimizer=optimizer,
        paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0),
        accumulative_counts=accumulate,
        **extra,
    )
    return build_optim_wrapper(net, cfg)


# --- (a) the multiplier is the diagonal of J J^T ---------------------------------------------


@pytest.mark.parametrize('spec', [(C, C, 1, True), (C, C2, 2, False), (3, C, 2, False)])
def test_multiplier_is_the_diagonal_of_the_jacobian_product(spec):
    csla = CSLALayer(*spec, seed=3)
    shapes = [csla.kernel.shape, csla.point.shape] + ([csla.identity.shape] if spec[3] else [])
    sizes = [math.prod(s) for s in shapes]

    def kernel_of(theta):
        parts = [x.view(s) for x, s in zip(theta.split(sizes), shapes)]
        return csla.equivalent_kernel(*parts).reshape(-1)

    theta = torch.cat(
        [csla.kernel.detach().reshape(-1), csla.point.detach().reshape(-1)]
        + ([csla.identity.detach()] if spec[3] else [])
    )
    jac = torch.autograd.functional.jacobian(kernel_of, theta)
    jjt = jac @ jac.T
    diag = torch.diagonal(jjt)
    assert (jjt - torch.diag(diag)).abs().max().item() == 0  # every scalar feeds one entry

    target = TargetLayer(*spec, s=csla.s, t=csla.t)
    scales = collect_branch_scales(target)
    assert list(scales) == [target.weight]
    m = branch_multiplier(scales[target.weight], DT)
    assert rel(m.reshape(-1), diag) <= 1e-15
    # and the optimizer uses it (built in float64 from the float32 scales: s**2 exactly)
    opt = RepOptSGD(target.parameters())
    opt.attach_branch_scales(scales)
    assert opt.multiplier(target.weight).dtype == DT
    assert torch.equal(opt.multiplier(target.weight), m)
    # the scales index the output channel: rows of M follow s_c, not columns
    s2 = csla.s**2
    assert torch.equal(m[:, :, 0, 0], s2.view(-1, 1).expand(m.shape[:2]))
    if spec[3]:
        c = torch.arange(spec[1])
        assert torch.equal(m[c, c, 1, 1], s2 + csla.t**2 + 1)


# --- (b) SGD: k steps of the CSLA and of the target -------------------------------------------

SGD_CASES = {
    'nesterov': dict(momentum=0.9, nesterov=True, weight_decay=0.05),
    'dampening+accumulation': dict(momentum=0.9, dampening=0.3, weight_decay=0.05, accumulate=2),
    'no-momentum': dict(weight_decay=0.05),
    'decoupled-decay': dict(
        momentum=0.9, weight_decay=0.05, decoupled_weight_decay=True, accumulate=2
    ),
}
LR = 0.2


class NaiveSGDW(torch.optim.Optimizer):
    """SGD with decoupled weight decay, written out for the CSLA's parameters (the reference
    of RepOptSGD(decoupled_weight_decay=True)): with g the gradient and b the momentum buffer
    (b = g at the first step, then b = momentum * b + g), ``p <- p - lr * wd * p - lr * b``."""

    def __init__(self, params, lr, momentum, weight_decay, decoupled_weight_decay=True):
        assert decoupled_weight_decay
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, mu = group['lr'], group['weight_decay'], group['momentum']
            for p in group['params']:
                if p.grad is None:
                    continue
                state = self.state[p]
                if 'buffer' not in state:
                    state['buffer'] = p.grad.clone()
                else:
                    state['buffer'] = mu * state['buffer'] + p.grad
                p.copy_(p - lr * wd * p - lr * state['buffer'])


def run_sgd_pair(case: dict, *, clip=None, csla_clip=None, neg=None):
    """Train the CSLA (torch SGD, or :class:`NaiveSGDW` for decoupled decay) and the target
    (RepOptSGD via the constructor); ``neg`` names a negative control."""
    case = dict(case)
    accumulate = case.pop('accumulate', 1)
    csla = make_csla(trainable_scales=neg == 'hs-model')
    target = make_target(csla, reinit=neg != 'no-reinit')
    groups = csla_groups(csla, decay_identity=neg != 'identity-not-decayed')
    if case.get('decoupled_weight_decay'):
        opt_c = NaiveSGDW(groups, lr=LR, **case)
    else:
        opt_c = torch.optim.SGD(groups, lr=LR, foreach=False, **case)
    wrap_c = OptimWrapper(
        opt_c,
        accumulative_counts=accumulate,
        clip_grad=None if csla_clip is None else dict(max_norm=csla_clip),
    )

    before_step = None
    if neg in ('decay-multiplied', 'no-multiplier', 'plain-clip'):
        # built by hand: the constructor refuses these
        params = [
            dict(params=[lt.weight for lt in target.layers] + [target.fc.weight]),
            dict(
                params=[p for n, p in target.named_parameters() if '.bn.' in n or n == 'fc.bias'],
                weight_decay=0.0,
            ),
        ]
        opt_t = RepOptSGD(params, lr=LR, **case)
        opt_t.attach_branch_scales({} if neg == 'no-multiplier' else collect_branch_scales(target))
        wrap_t = OptimWrapper(
            opt_t,
            accumulative_counts=accumulate,
            clip_grad=dict(max_norm=clip) if neg == 'plain-clip' else None,
        )
        if neg == 'decay-multiplied':
            # the L2 term already in the gradient when the multiplier acts (it must not be)
            opt_t.param_groups[0]['weight_decay'] = 0.0
            kernels = [lt.weight for lt in target.layers]
            wd = case['weight_decay']

            def before_step():
                with torch.no_grad():
                    for w in kernels:
                        w.grad.add_(w, alpha=wd)
                    target.fc.weight.grad.add_(target.fc.weight, alpha=wd)
    else:
        extra = {} if clip is None else dict(clip_grad=dict(type='csla', max_norm=clip))
        wrap_t = target_wrapper(target, dict(type='RepOptSGD', lr=LR, **case), accumulate, **extra)
        assert isinstance(wrap_t.optimizer, RepOptSGD)
    logits_c = train(csla, wrap_c, LR, accumulate)
    logits_t = train(target, wrap_t, LR, accumulate, before_step=before_step)
    return compare(csla, target, logits_c, logits_t)


@pytest.mark.parametrize('name', sorted(SGD_CASES))
def test_repopt_sgd_equals_sgd_on_the_csla(name):
    err = run_sgd_pair(SGD_CASES[name])
    print(f'SGD {name}: {err:.1e}')
    assert err <= TOL


NEGATIVE = ('decay-multiplied', 'identity-not-decayed', 'no-multiplier', 'no-reinit', 'hs-model')


@pytest.mark.parametrize('neg', NEGATIVE)
def test_negative_controls_fail_the_comparison(neg):
    err = run_sgd_pair(SGD_CASES['nesterov'], neg=neg)
    print(f'negative control {neg}: {err:.1e}')
    assert err > 1e-4  # > 1e8 times the tolerance


def initial_csla_grad_norm():
    csla = make_csla()
    x, y = batches(1)[0]
    F.cross_entropy(csla(x), y).backward()
    return torch.nn.utils.clip_grad_norm_(csla.parameters(), float('inf')).item()


def test_csla_norm_clipping_equals_clipped_csla_training_and_plain_clipping_does_not():
    max_norm = 0.3 * initial_csla_grad_norm()  # active from the first step on
    err = run_sgd_pair(SGD_CASES['nesterov'], clip=max_norm, csla_clip=max_norm)
    print(f'CSLA-norm clipping: {err:.1e}')
    assert err <= TOL
    # both runs log train/grad_norm (OptimWrapper's clipping, then RepOpt's step): the CSLA
    # norms computed from the plain model are the CSLA's norms, and clipping was active
    norms = MessageHub.get_current_instance().get_scalar('train/grad_norm').data[0][-2 * STEPS :]
    assert rel(torch.tensor(norms[STEPS:]), torch.tensor(norms[:STEPS])) <= TOL
    assert (norms > max_norm).sum() >= STEPS // 2
    err = run_sgd_pair(SGD_CASES['nesterov'], clip=max_norm, csla_clip=max_norm, neg='plain-clip')
    print(f'negative control plain-norm clipping: {err:.1e}')
    assert err > 1e-4


def grads_and_models(seed=0):
    """A small plain model with gradients, and a copy (for torch vs RepOpt on plain params)."""
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 9, 2)
    ).to(DT)
    return net, copy.deepcopy(net)


def run_plain(net, opt, steps=4):
    data = batches(steps, batch=3, size=(5, 5), seed=9)
    for i, (x, _) in enumerate(data):
        for group in opt.param_groups:
            group['lr'] = cosine(i, 0.1)
        opt.zero_grad()
        net(x[:, :3]).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize(
    'kwargs',
    [
        dict(momentum=0.9, nesterov=True, weight_decay=0.01),
        dict(momentum=0.8, dampening=0.2, weight_decay=0.01),
        dict(),
    ],
)
def test_parameters_without_multiplier_follow_torch_sgd_bit_for_bit(kwargs):
    a, b = grads_and_models()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, foreach=False, **kwargs)
    opt_b = RepOptSGD(b.parameters(), lr=0.1, **kwargs)
    opt_b.attach_branch_scales({})
    run_plain(a, opt_a)
    run_plain(b, opt_b)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize('amsgrad', [False, True])
def test_parameters_without_scales_follow_torch_adamw_bit_for_bit(amsgrad):
    a, b = grads_and_models()
    opt_a = torch.optim.AdamW(
        a.parameters(), lr=0.01, weight_decay=0.05, amsgrad=amsgrad, foreach=False
    )
    opt_b = RepOptAdamW(b.parameters(), lr=0.01, weight_decay=0.05, amsgrad=amsgrad)
    opt_b.attach_branch_scales({})
    run_plain(a, opt_a)
    run_plain(b, opt_b)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize(
    'optimizer',
    [
        dict(type='RepOptSGD', lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
        dict(type='RepOptAdamW', lr=0.01, weight_decay=0.05),
    ],
)
def test_step_leaves_the_gradients_alone(optimizer):
    target = make_target(make_csla())
    wrapper = target_wrapper(target, optimizer, clip_grad=dict(type='csla', max_norm=1e-3))
    x, y = batches(1)[0]
    for _ in range(2):  # the second step has momentum buffers / moments
        F.cross_entropy(target(x), y).backward()
        before = [p.grad.clone() for p in target.parameters()]
        wrapper.optimizer.step()
        for p, g in zip(target.parameters(), before):
            assert torch.equal(p.grad, g)
        wrapper.zero_grad()


# --- (c) exact AdamW ----------------------------------------------------------------------------


@pytest.mark.parametrize('amsgrad', [False, True])
def test_repopt_adamw_equals_adamw_on_the_csla(amsgrad):
    csla = make_csla()
    target = make_target(csla)
    kw = dict(lr=0.02, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, amsgrad=amsgrad)
    wrap_c = OptimWrapper(torch.optim.AdamW(csla_groups(csla), foreach=False, **kw))
    wrap_t = target_wrapper(target, dict(type='RepOptAdamW', **kw))
    err = compare(csla, target, train(csla, wrap_c, kw['lr']), train(target, wrap_t, kw['lr']))
    print(f'AdamW (amsgrad={amsgrad}): {err:.1e}')
    assert err <= TOL


@pytest.mark.parametrize('amsgrad', [False, True])
def test_a_kernels_adamw_moments_are_torchs_on_the_raw_gradient(amsgrad):
    """The state of a RepOpt kernel is what torch's AdamW keeps for its raw gradient, bit for
    bit: the multiplier acts on the update only, and a plain AdamW state loads as it is."""
    g = torch.Generator().manual_seed(5)
    scales = torch.randn(2, C2, C, 3, 3, generator=g, dtype=DT)
    kernel = nn.Parameter(torch.randn(C2, C, 3, 3, generator=g, dtype=DT))
    plain = nn.Parameter(kernel.detach().clone())
    kw = dict(lr=0.01, weight_decay=0.05, amsgrad=amsgrad)
    ours = RepOptAdamW([kernel], **kw)
    ours.attach_branch_scales({kernel: scales})
    ref = torch.optim.AdamW([plain], foreach=False, **kw)
    for _ in range(3):
        grad = torch.randn(kernel.shape, generator=g, dtype=DT)
        kernel.grad, plain.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert set(ours.state[kernel]) == set(ref.state[plain])
    for key, value in ref.state[plain].items():
        assert torch.equal(ours.state[kernel][key], value), key
    assert not torch.equal(kernel, plain)  # the kernel moved by its branches, not as plain


def test_official_adamw_rule_is_exact_off_centre_and_off_at_mixed_sign_centres():
    """One step from equal states: the power-1 rule moves off-centre taps like the CSLA and
    centre taps (where branches with mixed signs overlap) differently."""
    csla = make_csla()
    deltas = {}
    for mode in ('csla', 'exact', 'official'):
        c = copy.deepcopy(csla)
        net = c if mode == 'csla' else make_target(c)
        if mode == 'csla':
            opt = torch.optim.AdamW(csla_groups(c), lr=0.01, eps=1e-8, weight_decay=0.0)
            before = c.layers[0].equivalent_kernel().detach().clone()
        else:
            opt = target_wrapper(
                net, dict(type='RepOptAdamW', lr=0.01, eps=1e-8, weight_decay=0.0, mode=mode)
            ).optimizer
            before = net.layers[0].weight.detach().clone()
        x, y = batches(1)[0]
        F.cross_entropy(net(x), y).backward()
        opt.step()
        after = (
            c.layers[0].equivalent_kernel() if mode == 'csla' else net.layers[0].weight
        ).detach()
        deltas[mode] = after - before
    centre = torch.zeros_like(deltas['csla'], dtype=torch.bool)
    centre[:, :, 1, 1] = True
    assert rel(deltas['exact'], deltas['csla']) <= TOL
    assert rel(deltas['official'][~centre], deltas['csla'][~centre]) <= TOL
    err = rel(deltas['official'][centre], deltas['csla'][centre])
    print(f'official AdamW rule at centre taps, one step: {err:.1e}')
    assert err > 1e-2


# --- (d) what the constructor refuses -----------------------------------------------------------


class LARS(torch.optim.SGD):
    """Stands in for mmpretrain's LARS (only the name matters)."""


def build(net, optimizer=None, **cfg):
    optimizer = optimizer or dict(type='RepOptSGD', lr=0.1, weight_decay=1e-4)
    return build_optim_wrapper(
        net, dict(constructor='RepOptOptimWrapperConstructor', optimizer=optimizer, **cfg)
    )


@pytest.mark.parametrize(
    'optimizer, message',
    [
        (dict(type='SGD', lr=0.1), "use type='RepOptSGD'"),
        (dict(type='AdamW', lr=0.1), "use type='RepOptAdamW'"),
        (dict(type='Adam', lr=0.1, weight_decay=1e-4), 'coupled L2'),
        (dict(type=LARS, lr=0.1), 'trust ratio'),
        (dict(type='NoSuchOptimizer', lr=0.1), 'not registered'),
    ],
)
def test_constructor_refuses_optimizers_it_cannot_make_exact(optimizer, message):
    with pytest.raises(ConfigError, match=message):
        build(make_target(make_csla()), optimizer)


def test_constructor_refuses_a_model_without_multipliers():
    with pytest.raises(ConfigError, match='RepOpt optimizer on a model without multipliers'):
        build(nn.Linear(3, 2))


@pytest.mark.parametrize(
    'clip, message',
    [
        (dict(max_norm=1.0), 'plain gradient norm'),
        (dict(type='value', clip_value=1.0), 'plain gradient norm'),
        (dict(type='csla'), 'max_norm'),
        (dict(type='csla', max_norm=1.0, norm_type=1), 'norm_type=2'),
    ],
)
def test_constructor_refuses_plain_clipping(clip, message):
    with pytest.raises(ConfigError, match=message):
        build(make_target(make_csla()), clip_grad=clip)


@pytest.mark.parametrize(
    'custom, message',
    [
        (
            {'layers.0.weight': dict(decay_mult=0.0)},
            r"custom_keys\['layers.0.weight'\].*decay_mult",
        ),
        ({'layers': dict(lr_mult=0.1)}, r"custom_keys\['layers'\].*lr_mult"),
    ],
)
def test_constructor_refuses_per_kernel_hyper_parameters(custom, message):
    with pytest.raises(ConfigError, match=message):
        build(make_target(make_csla()), paramwise_cfg=dict(custom_keys=custom))
    # unless asked for: a backbone lr_mult when fine-tuning is a deliberate choice
    wrapper = build(
        make_target(make_csla()), paramwise_cfg=dict(custom_keys=custom, repopt_strict=False)
    )
    assert len(wrapper.optimizer.repopt_params) == 2


def test_constructor_accepts_frozen_kernels():
    """frozen_stages: a frozen kernel never moves, as the frozen CSLA layer would not."""
    target = make_target(make_csla())
    target.layers[0].weight.requires_grad_(False)
    wrapper = build(target)
    # the frozen kernel keeps its scales in case it is unfrozen later
    assert any(p is target.layers[0].weight for p in wrapper.optimizer.repopt_params)
    assert any(p is target.layers[1].weight for p in wrapper.optimizer.repopt_params)


def test_scales_are_checked():
    target = make_target(make_csla())
    layer = target.layers[0]
    good = layer.repopt_branch_scales
    layer.repopt_branch_scales = lambda: {layer.weight: good()[layer.weight][:, :2]}
    with pytest.raises(ValueError, match='has shape'):
        collect_branch_scales(target)
    layer.repopt_branch_scales = lambda: {layer.weight: good()[layer.weight].half()}
    with pytest.raises(ValueError, match='float32 or float64'):
        collect_branch_scales(target)
    layer.repopt_branch_scales = lambda: {layer.weight: good()[layer.weight].requires_grad_()}
    with pytest.raises(ValueError, match='constant scales'):
        collect_branch_scales(target)
    layer.repopt_branch_scales = good
    target.layers[1].repopt_branch_scales = lambda: {layer.weight: good()[layer.weight]}
    with pytest.raises(ValueError, match="'layers.0.weight' has branch scales from both"):
        collect_branch_scales(target)


def test_stepping_without_scales_is_an_error():
    target = make_target(make_csla())
    opt = RepOptSGD(target.parameters(), lr=0.1)
    x, y = batches(1)[0]
    F.cross_entropy(target(x), y).backward()
    with pytest.raises(RuntimeError, match='no branch scales attached'):
        opt.step()
    # nor does a copy (torch pickles defaults, state and param_groups only) train without
    opt.attach_branch_scales(collect_branch_scales(target))
    opt.step()
    clone = copy.deepcopy(opt)
    for p in clone.param_groups[0]['params']:
        p.grad = torch.zeros_like(p)  # deepcopy drops gradients
    with pytest.raises(RuntimeError, match='no branch scales attached'):
        clone.step()


# --- (e) resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'optimizer',
    [
        dict(type='RepOptSGD', lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
        dict(type='RepOptAdamW', lr=0.01, weight_decay=0.05, amsgrad=True),
    ],
)
def test_resume_is_bit_exact(optimizer):
    data = batches(6)
    target = make_target(make_csla())
    wrapper = target_wrapper(target, optimizer, clip_grad=dict(type='csla', max_norm=1.0))
    train(target, wrapper, optimizer['lr'], steps=3, data=data[:3])
    buf = io.BytesIO()
    torch.save(dict(model=target.state_dict(), optim=wrapper.state_dict()), buf)
    # the multipliers are not in the checkpoint: torch's state layout only
    state = wrapper.state_dict()
    assert set(state) <= {'state', 'param_groups', 'base_param_settings'}
    assert {k for s in state['state'].values() for k in s} <= {
        'momentum_buffer',
        'step',
        'exp_avg',
        'exp_avg_sq',
        'max_exp_avg_sq',
    }
    train(target, wrapper, optimizer['lr'], steps=3, data=data[3:])

    buf.seek(0)
    ckpt = torch.load(buf)
    resumed = make_target(make_csla())
    resumed.load_state_dict(ckpt['model'])
    wrapper2 = target_wrapper(resumed, optimizer, clip_grad=dict(type='csla', max_norm=1.0))
    wrapper2.load_state_dict(ckpt['optim'])
    train(resumed, wrapper2, optimizer['lr'], steps=3, data=data[3:])
    for (name, a), b in zip(target.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


# --- mixed precision ----------------------------------------------------------------------------


LOSS_SCALE = 1000.0  # not a power of two: unscaling then rounds, so its order shows


def amp_wrapper(target, monkeypatch, optimizer: dict, wrapper_type='AmpOptimWrapper', **extra):
    """``wrapper_type`` with RepOptSGD through the constructor; AmpOptimWrapper with a static
    CPU loss scale of :data:`LOSS_SCALE`."""
    # AmpOptimWrapper first builds a CUDA GradScaler, which warns and disables itself on the CPU
    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp

    monkeypatch.setattr(amp, 'is_cuda_available', lambda: True)
    wrapper = build_optim_wrapper(
        target,
        dict(
            type=wrapper_type,
            constructor='RepOptOptimWrapperConstructor',
            optimizer=dict(type='RepOptSGD', **optimizer),
            **extra,
        ),
    )
    if wrapper_type == 'AmpOptimWrapper':
        assert wrapper.clip_grad_kwargs is None  # the CSLA clipping lives in the step
        wrapper.loss_scaler = torch.amp.GradScaler(
            'cpu', init_scale=LOSS_SCALE, growth_interval=10**6
        )
    return wrapper


@pytest.mark.filterwarnings('ignore::FutureWarning', 'ignore::UserWarning')
def test_amp_multiplies_the_unscaled_gradient(monkeypatch):
    """One AmpOptimWrapper step, float32, bit for bit. With lr 1 from zero weights the step
    writes ``-M * g`` into each kernel: it must be ``M * (g_scaled * (1 / scale))``
    (GradScaler's reciprocal, then the multiplier), not ``(M * g_scaled) * (1 / scale)``.
    With a power-of-two scale both orders give the same bits; at 1000 they differ, which the
    test checks too, so it sees a wrong order."""
    target = make_target(make_csla()).float()
    wrapper = amp_wrapper(target, monkeypatch, dict(lr=1.0))
    opt = wrapper.optimizer
    x, y = batches(1)[0]
    loss = F.cross_entropy(target(x.float()), y)
    # the scaled gradients, computed apart (p.grad is what the code under test may change)
    params = list(target.parameters())
    scaled = dict(
        zip(params, torch.autograd.grad(loss * torch.tensor(LOSS_SCALE), params, retain_graph=True))
    )
    wrapper.backward(loss)  # scaled by the loss scaler
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    inv_scale = torch.tensor(LOSS_SCALE).double().reciprocal().float()
    wrapper.step()
    assert len(opt.repopt_params) == len(LAYERS)
    for p in target.parameters():
        unscaled = scaled[p] * inv_scale
        m = opt.multiplier(p)
        if m is None:
            assert torch.equal(-p.detach(), unscaled)
            continue
        assert m.dtype == torch.float32
        right, wrong = unscaled * m, (scaled[p] * m) * inv_scale
        assert not torch.equal(right, wrong)  # the scale makes the order visible
        assert torch.equal(-p.detach(), right), 'the multiplier did not act after unscaling'


@pytest.mark.filterwarnings('ignore::FutureWarning', 'ignore::UserWarning')
def test_amp_optim_wrapper_steps_as_the_plain_wrapper_with_csla_clipping(monkeypatch):
    """Several steps with CSLA-norm clipping active: AmpOptimWrapper (scale 1000) equals
    OptimWrapper to float32 rounding, since the clipping norm and the multiplier see the
    unscaled gradients (a norm of the scaled ones would be 1000 times too large)."""
    runs, norms = [], []
    optimizer = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)
    for wrapper_type in ('OptimWrapper', 'AmpOptimWrapper'):
        target = make_target(make_csla()).float()
        wrapper = amp_wrapper(
            target, monkeypatch, optimizer, wrapper_type, clip_grad=dict(type='csla', max_norm=0.5)
        )
        for p in wrapper.optimizer.repopt_params:
            assert wrapper.optimizer.multiplier(p).dtype == torch.float32
        for x, y in batches(4):
            wrapper.update_params(F.cross_entropy(target(x.float()), y))
            norms.append(MessageHub.get_current_instance().get_scalar('train/grad_norm').current())
        runs.append([p.detach().clone() for p in target.parameters()])
    assert max(norms) > 0.5  # clipping was active
    # float32: scale 1000 is no power of two, so the scaled backward rounds differently at each
    # of this two-conv net's ops and the unscaling rounds once more: a few u32 (2^-24) per op and
    # step; 1e-5 ≈ 168·u32 for the norms, 1e-6 ≈ 17·u32 for the weights after 4 steps (observed
    # 1.2 and at most 1.9 u32 on both kernel settings); the scaled norm would be 1000x off
    assert rel(torch.tensor(norms[4:]), torch.tensor(norms[:4])) <= 1e-5
    assert rel(runs[1], runs[0]) <= 1e-6


def test_bf16_autocast_keeps_multipliers_and_update_in_float32():
    target = make_target(make_csla()).float()
    opt = RepOptSGD(target.parameters(), lr=0.1)
    opt.attach_branch_scales(collect_branch_scales(target))
    x, y = batches(1)[0]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = F.cross_entropy(target(x.float()), y)
    loss.backward()
    w = target.layers[0].weight
    m = opt.multiplier(w)
    assert m.dtype == torch.float32 and w.grad.dtype == torch.float32
    expected = torch.add(w.detach(), w.grad * m, alpha=-0.1)
    opt.step()
    assert torch.equal(w.detach(), expected)


# --- sharded training: a rank's pieces --------------------------------------------------------

# one kernel split over three ranks the way FSDP does (flattened, at arbitrary entries): the
# first rank's piece is empty, the boundary at 77 falls inside an output channel
PIECES = ((0, 0), (0, 77), (77, C2 * C * 9))


@pytest.mark.parametrize(
    'optimizer',
    [
        dict(type=RepOptSGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
        dict(type=RepOptAdamW, lr=0.01, weight_decay=0.05, amsgrad=True),
    ],
    ids=['sgd', 'adamw'],
)
def test_pieces_with_their_scales_step_as_the_whole_kernel_sliced(optimizer):
    """Each rank steps its pieces with scales_of_piece's scales: the pieces joined are the
    whole kernel stepped with the whole scales (bit for bit: every operation is per entry),
    and a piece's multiplier is the naive whole multiplier, sliced."""
    from mmrepa.engine.optimizers import scales_of_piece

    g = torch.Generator().manual_seed(3)
    # a different scale at every entry (exact zeros too): a piece given another entry's
    # scales moves differently
    scales = torch.randn(2, C2, C, 3, 3, generator=g, dtype=DT)
    scales[1, :, :, 0] = 0.0
    kind, kw = optimizer['type'], {k: v for k, v in optimizer.items() if k != 'type'}
    whole = nn.Parameter(torch.randn(C2, C, 3, 3, generator=g, dtype=DT))
    pieces = [nn.Parameter(whole.detach().reshape(-1)[a:b].clone()) for a, b in PIECES]
    opt = kind([whole], **kw)
    opt.attach_branch_scales({whole: scales})
    ranks = []
    for p, (a, b) in zip(pieces, PIECES):
        ranks.append(kind([p], **kw))
        ranks[-1].attach_branch_scales({p: scales_of_piece(scales, a, b, p.shape)})
        naive = (scales * scales).sum(0).reshape(-1)[a:b]
        assert torch.equal(ranks[-1].multiplier(p), naive)
    for _ in range(3):
        grad = torch.randn(whole.shape, generator=g, dtype=DT)
        whole.grad = grad.clone()
        opt.step()
        for p, rank, (a, b) in zip(pieces, ranks, PIECES):
            p.grad = grad.reshape(-1)[a:b].clone()
            rank.step()
    assert torch.equal(torch.cat([p.detach() for p in pieces]), whole.detach().reshape(-1))


def test_a_wrapper_that_forwards_attribute_lookups_is_not_a_second_owner():
    """FSDP and activation checkpointing wrap a layer in a module whose attribute lookups
    reach the layer's: its scales are collected once, from the layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    target = make_target(make_csla())
    expected = collect_branch_scales(target)
    target.layers[0] = checkpoint_wrapper(target.layers[0])
    assert callable(getattr(target.layers[0], 'repopt_branch_scales', None))
    scales = collect_branch_scales(target)
    assert list(scales) == list(expected)
    assert all(torch.equal(scales[p], a) for p, a in expected.items())


# --- (f) DDP --------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


DDP_OPTIM = dict(type='RepOptSGD', lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)


def ddp_run(world, rank):
    """4 steps on a BN-free target (per-rank BN statistics would differ from the full batch),
    each rank on its share of every batch; the final weights."""
    torch.manual_seed(0)
    target = make_target(make_csla(), norm=False)
    model = target
    if world > 1:
        model = nn.parallel.DistributedDataParallel(target)
    wrapper = target_wrapper(model, DDP_OPTIM, clip_grad=dict(type='csla', max_norm=0.2))
    for x, y in batches(4, batch=8):
        share = slice(rank * 8 // world, (rank + 1) * 8 // world)
        wrapper.update_params(F.cross_entropy(model(x[share]), y[share]))
    return [p.detach().clone() for p in target.parameters()]


def _ddp_worker(rank, port, out_dir):
    os.environ['OMP_NUM_THREADS'] = '1'
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=2)
    try:
        torch.save(ddp_run(2, rank), osp.join(out_dir, f'rank{rank}.pth'))
    finally:
        dist.destroy_process_group()


@pytest.mark.processes
def test_ddp_two_processes_equal_one_process_on_the_whole_batch(tmp_path):
    # spawn, not fork: see test_hooks_bn_recalibration's two_ranks
    mp.start_processes(
        _ddp_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method='spawn'
    )
    ranks = [torch.load(osp.join(tmp_path, f'rank{r}.pth')) for r in (0, 1)]
    single = ddp_run(1, 0)
    for a, b in zip(*ranks):
        assert torch.equal(a, b)
    err = rel(ranks[0], single)
    print(f'DDP 2 ranks vs 1 process: {err:.1e}')
    assert err <= TOL


def test_a_sharded_repopt_optimizer_without_attached_scales_is_refused():
    """mmengine's FSDPStrategy rebuilds an optimizer given built, without its scales: attaching
    the pieces' (none) would make it train as plain SGD; refused in one line instead."""
    from mmrepa.engine.strategies import _attach_pieces

    model = nn.Linear(2, 2)
    with pytest.raises(
        ConfigError, match='no RepOpt kernel attached.*RepOptOptimWrapperConstructor'
    ):
        _attach_pieces(RepOptSGD(model.parameters(), lr=0.1), model)
