"""A foldable layer written outside the package, as a user would, on mmrepa's base: it folds
through ``fold_model``, ``switch_to_deploy`` and ``ReparameterizeHook`` like mmrepa's own."""

import copy
import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from mmrepa import FoldError, fold_model
from mmrepa.engine import ReparameterizeHook
from mmrepa.errors import CheckpointError
from mmrepa.fold import FoldPolicy, Reparameterizable

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.


class LinearBNShortcut(Reparameterizable, nn.Module):
    """``y = bn(fc(x)) + x``, folded: ``y = fc'(x)`` with ``W' = s W + I``, ``b' = t``."""

    fold_state_keys = ('fc.bias', 'bn.running_mean')  # only the folded / unfolded form has it

    def __init__(self, dims: int, deploy: bool = False):
        super().__init__()
        self.deploy = deploy
        self.fc = nn.Linear(dims, dims, bias=deploy)
        if not deploy:
            self.bn = nn.BatchNorm1d(dims)

    def forward(self, x):
        return self.fc(x) if self.deploy else self.bn(self.fc(x)) + x

    def _fold_tensors(self, dtype, policy):
        bn = self.bn
        scale = bn.weight.to(dtype) / torch.sqrt(bn.running_var.to(dtype) + bn.eps)
        shift = bn.bias.to(dtype) - bn.running_mean.to(dtype) * scale
        eye = torch.eye(self.fc.in_features, dtype=dtype, device=self.fc.weight.device)
        return {'fc.weight': self.fc.weight.to(dtype) * scale[:, None] + eye, 'fc.bias': shift}

    def _apply_fold(self, tensors, policy):
        del self.bn
        self.fc = nn.Linear(self.fc.in_features, self.fc.out_features).to(self.fc.weight)


def trained(dims=6, dtype=torch.float64, seed=0):
    """Two layers in a Sequential, with BatchNorm statistics and affines that are not 1 and 0."""
    torch.manual_seed(seed)
    model = nn.Sequential(LinearBNShortcut(dims), nn.ReLU(), LinearBNShortcut(dims)).to(dtype)
    for layer in (model[0], model[2]):
        bn = layer.bn
        for t, low in (
            (bn.weight, 0.5),
            (bn.bias, -1),
            (bn.running_mean, -1),
            (bn.running_var, 0.5),
        ):
            t.data.uniform_(low, low + 1.5)
    return model.eval()


def reference(model, x):
    """The unfolded model computed by hand from its tensors (BatchNorm in eval mode)."""
    for m in model:
        if isinstance(m, LinearBNShortcut):
            bn, h = m.bn, x @ m.fc.weight.T
            x = (
                (h - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight
                + bn.bias
                + x
            )
        else:
            x = m(x)
    return x


@pytest.mark.parametrize('dtype, tol', [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fold_model_folds_a_user_layer_exactly(dtype, tol):
    model = trained(dtype=dtype)
    x = torch.randn(5, 6, dtype=dtype)
    with torch.no_grad():
        ref = reference(model, x)
        report = fold_model(model, logger=None)
        out = model(x)
    assert report.folded == {'LinearBNShortcut': 2}  # the user's class takes mmrepa's path
    assert report.unfolded == []
    assert all(not hasattr(m, 'bn') and m.deploy for m in (model[0], model[2]))
    assert model[0].fc.weight.dtype == dtype and model[0].fc.bias is not None
    assert (out - ref).abs().max().item() <= tol * ref.abs().max().item()


def test_switch_to_deploy_folds_in_eval_mode_and_gives_back_the_training_flag():
    layer = trained()[0].train()
    x = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        ref = reference([layer], x)
        layer.switch_to_deploy()
        assert layer.training and layer.deploy
        assert (layer(x) - ref).abs().max().item() < 1e-12
    layer.switch_to_deploy()  # idempotent


def test_the_folded_state_dict_loads_into_deploy_true_and_not_into_the_unfolded_layer():
    folded = fold_model(trained(), logger=None).model
    model = nn.Sequential(LinearBNShortcut(6, deploy=True), nn.ReLU(), LinearBNShortcut(6, True))
    model.double().load_state_dict(folded.state_dict())
    x = torch.randn(3, 6, dtype=torch.float64)
    assert torch.equal(model(x), folded(x))
    with pytest.raises(CheckpointError, match=r'^0: the checkpoint holds folded weights'):
        trained().load_state_dict(folded.state_dict())
    with pytest.raises(CheckpointError, match=r'^0: the checkpoint holds unfolded weights'):
        model.load_state_dict(trained().state_dict())


def test_the_base_refuses_training_mode_and_non_finite_results_and_changes_nothing():
    model = trained().train()
    with pytest.raises(FoldError, match=r'training mode.*call model\.eval\(\) first$'):
        fold_model(model, logger=None)
    model.eval()[2].bn.running_var[1] = -1.0  # sqrt of a negative: NaN in the folded weight
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(FoldError, match=r'2 \(LinearBNShortcut\).*folded fc\.weight .*not finite'):
        fold_model(model, logger=None)
    assert hasattr(model[0], 'bn') and not model[0].deploy  # the first layer's fold undone
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_a_subclass_cannot_take_over_the_fold():
    with pytest.raises(TypeError, match='overrides reparameterize'):

        class Takeover(LinearBNShortcut):
            def reparameterize(self, policy=None):
                pass

    # nn.Module first would skip the base's load check (Module's loader calls no super())
    with pytest.raises(TypeError, match='before Reparameterizable'):

        class Backwards(nn.Module, Reparameterizable):
            pass


def test_the_policy_reaches_the_users_fold():
    seen = []

    class Records(LinearBNShortcut):
        def _fold_tensors(self, dtype, policy):
            seen.append(policy)
            return super()._fold_tensors(dtype, policy)

    model = nn.Sequential(Records(4)).eval()
    fold_model(model, logger=None, policy=FoldPolicy(identity_apart=True))
    assert seen == [FoldPolicy(identity_apart=True)]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = trained()

    def forward(self, x):
        return self.body(x)


def test_reparameterize_hook_tests_the_folded_user_layer_and_restores_the_original():
    net = Net()
    x = torch.randn(2, 6, dtype=torch.float64)
    with torch.no_grad():
        ref = reference(net.body, x)
    runner = SimpleNamespace(
        model=net, test_dataloader=[], logger=logging.getLogger('test_fold_user_layer')
    )
    hook = ReparameterizeHook(verify=False)
    hook.before_test_epoch(runner)
    folded = runner.model
    assert folded is not net and hook.results['folded'] == {'LinearBNShortcut': 2}
    assert all(m.deploy for m in folded.body if isinstance(m, LinearBNShortcut))
    with torch.no_grad():
        assert (folded(x) - ref).abs().max().item() < 1e-12
    hook.after_test_epoch(runner)
    assert runner.model is net and hasattr(net.body[0], 'bn')  # the original, unfolded
