"""RepOpt-VGG trained by RepOptSGD equals the CSLA network trained by SGD (the RepOptimizers
paper's Eq. 2), through the mmengine optimizer constructor and the Runner: k steps, resume, no
re-init over loaded weights."""

import copy
import math

import pytest
import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper

import mmrepa  # noqa: F401
from mmrepa.backbones import RepOptVGG
from tests.helpers import REPOPT_VGG_TINY as TINY
from tests.helpers import csla_model_like, max_relative, random_scales, target_scales

STEPS = 8


class Net(nn.Module):
    """Backbone, global average pooling, a linear classifier."""

    def __init__(self, backbone: RepOptVGG, classes: int = 5):
        super().__init__()
        self.backbone = backbone
        self.fc = nn.Linear(backbone.num_features[-1], classes)

    def forward(self, x):
        return self.fc(self.backbone(x)[-1].mean((2, 3)))


def twins(seed=3):
    """(target, CSLA) networks in float64 that start from the same function."""
    target = RepOptVGG(TINY, out_indices=(3,)).double()
    target.load_scales(random_scales(target, seed=1))
    target.reinitialize(torch.Generator().manual_seed(seed))
    csla = csla_model_like(target, seed)
    csla.out_indices = (3,)
    torch.manual_seed(0)
    a = Net(target).double()
    b = Net(csla.double()).double()
    b.fc.load_state_dict(a.fc.state_dict())
    return a, b


PARAMWISE = dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0)


def repopt_wrapper(model, **optimizer):
    return build_optim_wrapper(
        model,
        dict(
            constructor='RepOptOptimWrapperConstructor',
            paramwise_cfg=PARAMWISE,
            optimizer=dict(type='RepOptSGD', **optimizer),
        ),
    )


def csla_wrapper(model, **optimizer):
    # the CSLA identity scale decays like the kernels (custom_keys win over flat_decay_mult)
    return build_optim_wrapper(
        model,
        dict(
            paramwise_cfg=dict(PARAMWISE, custom_keys={'scale_identity': dict(decay_mult=1.0)}),
            optimizer=dict(type='SGD', **optimizer),
        ),
    )


def train(model, wrapper, steps, lr0=0.05):
    g = torch.Generator().manual_seed(11)
    outputs = []
    for step in range(steps):
        for group in wrapper.optimizer.param_groups:
            group['lr'] = lr0 * 0.5 * (1 + math.cos(math.pi * step / steps))
        x = torch.randn(4, 3, 19, 14, generator=g, dtype=torch.float64)
        y = torch.randint(0, 5, (4,), generator=g)
        logits = model(x)
        outputs.append(logits.detach())
        wrapper.update_params(nn.functional.cross_entropy(logits, y))
    return outputs


@pytest.mark.parametrize('nesterov, dampening', [(True, 0.0), (False, 0.3)])
def test_k_steps_of_repoptsgd_equal_the_csla_network(nesterov, dampening):
    hyper = dict(lr=0.05, momentum=0.9, nesterov=nesterov, dampening=dampening, weight_decay=0.05)
    target, csla = twins()
    out_target = train(target, repopt_wrapper(target, **hyper), STEPS)
    out_csla = train(csla, csla_wrapper(csla, **hyper), STEPS)
    # float64 on both sides: 1e-10 ≈ 10^6·u64 of each tensor's scale, the size factor of STEPS
    # steps of sums over the batch and a conv reduction of 9·C_in terms in two orders (the
    # multiplier's, the branches'); a kernel entry near 0 is compared at its tensor's scale, not
    # its own (atol was 1e-12, half of it used); no multiplier is off by > 1e-3 (below)
    assert max_relative(out_target, out_csla) < 1e-10
    for name, layer in csla.backbone.layers().items():
        mine = target.backbone.layers()[name]
        kernel = layer.equivalent_kernel().detach()
        torch.testing.assert_close(
            mine.conv.weight, kernel, rtol=0, atol=1e-10 * kernel.abs().max().item()
        )
        torch.testing.assert_close(mine.bn.running_var, layer.bn.running_var, rtol=1e-10, atol=0)


def test_without_the_multiplier_or_with_undecayed_identity_it_differs():
    hyper = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)
    target, csla = twins()
    reference = train(csla, csla_wrapper(csla, **hyper), STEPS)
    plain = build_optim_wrapper(
        target, dict(paramwise_cfg=PARAMWISE, optimizer=dict(type='SGD', **hyper))
    )
    assert max_relative(train(target, plain, STEPS), reference) > 1e-3
    target, csla = twins()
    undecayed = build_optim_wrapper(
        csla, dict(paramwise_cfg=PARAMWISE, optimizer=dict(type='SGD', **hyper))
    )
    assert (
        max_relative(
            train(target, repopt_wrapper(target, **hyper), STEPS), train(csla, undecayed, STEPS)
        )
        > 1e-4
    )


def test_gradient_accumulation_keeps_the_equivalence():
    hyper = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)
    target, csla = twins()
    a = build_optim_wrapper(
        target,
        dict(
            constructor='RepOptOptimWrapperConstructor',
            paramwise_cfg=PARAMWISE,
            accumulative_counts=2,
            optimizer=dict(type='RepOptSGD', **hyper),
        ),
    )
    b = build_optim_wrapper(
        csla,
        dict(
            paramwise_cfg=dict(PARAMWISE, custom_keys={'scale_identity': dict(decay_mult=1.0)}),
            accumulative_counts=2,
            optimizer=dict(type='SGD', **hyper),
        ),
    )
    a.initialize_count_status(target, 0, STEPS)
    b.initialize_count_status(csla, 0, STEPS)
    assert max_relative(train(target, a, STEPS), train(csla, b, STEPS)) < 1e-10


def test_plain_clipping_is_refused_and_csla_clipping_is_exact():
    target, csla = twins()
    with pytest.raises(ValueError, match='clip'):
        build_optim_wrapper(
            target,
            dict(
                constructor='RepOptOptimWrapperConstructor',
                paramwise_cfg=PARAMWISE,
                clip_grad=dict(max_norm=1.0),
                optimizer=dict(type='RepOptSGD', lr=0.1, weight_decay=1e-4),
            ),
        )
    hyper = dict(lr=0.05, momentum=0.9, weight_decay=0.05)
    a = build_optim_wrapper(
        target,
        dict(
            constructor='RepOptOptimWrapperConstructor',
            paramwise_cfg=PARAMWISE,
            clip_grad=dict(type='csla', max_norm=0.5),
            optimizer=dict(type='RepOptSGD', **hyper),
        ),
    )
    b = build_optim_wrapper(
        csla,
        dict(
            paramwise_cfg=dict(PARAMWISE, custom_keys={'scale_identity': dict(decay_mult=1.0)}),
            clip_grad=dict(max_norm=0.5),
            optimizer=dict(type='SGD', **hyper),
        ),
    )
    assert max_relative(train(target, a, STEPS), train(csla, b, STEPS)) < 1e-10


def test_the_deployed_model_of_a_trained_target_is_exact():
    target, _ = twins()
    train(target, repopt_wrapper(target, lr=0.05, momentum=0.9, weight_decay=1e-3), 3)
    target.eval()
    x = torch.randn(2, 3, 21, 17, dtype=torch.float64)
    before = target(x)
    folded = mmrepa.reparameterize(copy.deepcopy(target))
    # u64 = 2^-53 × 9·32-term conv reductions ≈ 3e-14 a layer on values ≲ 1, × 8 layers and the
    # head ≲ 1e-12; observed 1.4e-17
    torch.testing.assert_close(folded(x), before, rtol=1e-12, atol=1e-12)


def test_constants_loaded_after_the_optimizer_is_built_are_the_ones_used():
    """mmengine's Runner builds the optimizer, then init_weights / load_from / resume bring
    the constants: the first step must use those, not the ones seen when it was built."""
    hyper = dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.05)
    target, csla = twins()
    loaded = copy.deepcopy(target.state_dict())
    with torch.no_grad():
        for m in target.backbone.layers().values():  # what a fresh model has before loading
            m.set_scales(
                torch.ones(m.out_channels), torch.ones(m.out_channels), torch.ones(m.out_channels)
            )
    wrapper = repopt_wrapper(target, **hyper)
    target.load_state_dict(loaded)  # as load_from / resume would
    assert (
        max_relative(train(target, wrapper, STEPS), train(csla, csla_wrapper(csla, **hyper), STEPS))
        < 1e-10
    )


# -- with SE blocks (RepOpt-VGG-L2‡): the block sits after the BN and ReLU that end each CSLA
# layer, downstream of the branch sum, so GR stays exact (the paper's Appendix A needs only the
# branches linear); its weights train as any plain parameter, with no multiplier


def se_twins(seed=3):
    """:func:`twins` with an SE block after every layer, the same SE weights on both sides."""
    target = RepOptVGG(TINY, out_indices=(3,), se=True).double()
    target.load_scales(random_scales(target, seed=1))
    target.reinitialize(torch.Generator().manual_seed(seed))
    csla = RepOptVGG(TINY, mode='csla', se=True, scales=target_scales(target), out_indices=(3,))
    plain = csla_model_like(target, seed)  # K0, P0 the target's rule of initialization drew
    csla.load_state_dict(
        {**plain.state_dict(), **{k: v for k, v in target.state_dict().items() if 'post_se' in k}}
    )
    torch.manual_seed(0)
    a = Net(target).double()
    b = Net(csla.double()).double()
    b.fc.load_state_dict(a.fc.state_dict())
    return a, b


def assert_se_twins_trained_alike(target, csla):
    for name, layer in csla.backbone.layers().items():
        mine = target.backbone.layers()[name]
        kernel = layer.equivalent_kernel().detach()
        torch.testing.assert_close(
            mine.conv.weight, kernel, rtol=0, atol=1e-10 * kernel.abs().max().item()
        )
        for p, q in zip(mine.post_se.parameters(), layer.post_se.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-10 * q.abs().max().item())


@pytest.mark.parametrize('nesterov, dampening', [(True, 0.0), (False, 0.3)])
def test_k_steps_of_repoptsgd_equal_the_csla_network_with_se_blocks(nesterov, dampening):
    hyper = dict(lr=0.05, momentum=0.9, nesterov=nesterov, dampening=dampening, weight_decay=0.05)
    target, csla = se_twins()
    out_target = train(target, repopt_wrapper(target, **hyper), STEPS)
    out_csla = train(csla, csla_wrapper(csla, **hyper), STEPS)
    # the bound of test_k_steps_of_repoptsgd_equal_the_csla_network: 10^6·u64 of the scale
    assert max_relative(out_target, out_csla) < 1e-10
    assert_se_twins_trained_alike(target, csla)


def test_k_steps_of_repoptadamw_equal_the_csla_network_with_se_blocks():
    """The exact per-branch AdamW rule, with the SE weights stepped by plain AdamW on both."""
    hyper = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    target, csla = se_twins()
    repopt = build_optim_wrapper(
        target,
        dict(
            constructor='RepOptOptimWrapperConstructor',
            paramwise_cfg=PARAMWISE,
            optimizer=dict(type='RepOptAdamW', **hyper),
        ),
    )
    reference = build_optim_wrapper(
        csla,
        dict(
            paramwise_cfg=dict(PARAMWISE, custom_keys={'scale_identity': dict(decay_mult=1.0)}),
            optimizer=dict(type='AdamW', foreach=False, **hyper),
        ),
    )
    out_target = train(target, repopt, STEPS, lr0=hyper['lr'])
    out_csla = train(csla, reference, STEPS, lr0=hyper['lr'])
    assert max_relative(out_target, out_csla) < 1e-10
    assert_se_twins_trained_alike(target, csla)


def test_the_deployed_model_of_a_trained_target_with_se_is_exact():
    target, _ = se_twins()
    train(target, repopt_wrapper(target, lr=0.05, momentum=0.9, weight_decay=1e-3), 3)
    target.eval()
    x = torch.randn(2, 3, 21, 17, dtype=torch.float64)
    before = target(x)
    folded = mmrepa.reparameterize(copy.deepcopy(target))
    assert all(m.post_se is not None for m in folded.backbone.layers().values())
    # as above (the SE gates, sigmoids ≤ 1 of short sums, add a few u64); observed 1.7e-18
    torch.testing.assert_close(folded(x), before, rtol=1e-12, atol=1e-12)
