import copy

import pytest
import torch
import torch.nn as nn

import mmrepa
from mmrepa import FoldError, reparameterize
from mmrepa.layers import ChannelIdleFFN

from .conftest import randomize_


class Recorder(nn.Module):
    """A foldable module that records the order in which folds happen."""

    def __init__(self, log, name, child=None):
        super().__init__()
        self.log, self.name, self.child, self.deploy = log, name, child, False

    def reparameterize(self):
        if not self.deploy:
            self.log.append(self.name)
            self.deploy = True


def test_folds_deepest_first_and_is_idempotent():
    log = []
    model = Recorder(log, 'outer', Recorder(log, 'middle', Recorder(log, 'inner'))).eval()
    assert reparameterize(model) is model
    assert log == ['inner', 'middle', 'outer']
    reparameterize(model)
    assert log == ['inner', 'middle', 'outer']


def test_training_mode_is_refused_with_a_clear_message():
    model = nn.Sequential(ChannelIdleFFN(8))
    with pytest.raises(FoldError, match=r'eval mode.*model\.eval\(\)'):
        reparameterize(model)
    # norm_eval-style: BN in eval but the FFN itself training is still refused
    model[0].norm1.eval()
    with pytest.raises(FoldError, match=r'first: 0\.norm2'):
        reparameterize(model)


def test_methods_named_reparameterize_with_arguments_are_not_called():

    class VAE(nn.Module):
        def reparameterize(self, mu, logvar):  # the other meaning of the word
            raise AssertionError('must not be called')

    reparameterize(nn.Sequential(VAE()).eval())


def test_non_finite_bn_statistics_name_the_module():
    model = nn.Sequential(nn.Linear(4, 4), ChannelIdleFFN(8)).eval()
    model[1].norm2.running_var[3] = float('nan')
    with pytest.raises(FoldError, match=r'1 \(ChannelIdleFFN\).*not finite'):
        reparameterize(model)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_folded_modules_keep_device_and_dtype(dtype):
    ffn = randomize_(ChannelIdleFFN(8)).to(dtype).eval()
    reparameterize(ffn)
    for p in ffn.parameters():
        assert p.dtype == dtype and p.device == torch.device('cpu')


def test_public_api():
    assert mmrepa.reparameterize is reparameterize
    assert issubclass(mmrepa.FoldError, RuntimeError)
    copy.deepcopy(ChannelIdleFFN(4))  # modules stay deep-copyable (the hook relies on it)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_models_fold_in_high_precision(dtype):
    half = randomize_(ChannelIdleFFN(32, idle_ratio=0.5)).to(dtype).eval()
    wide = copy.deepcopy(half).float()  # the same values, exactly representable in fp32
    reparameterize(half)
    reparameterize(wide)
    for (name, p), q in zip(half.named_parameters(), wide.parameters()):
        assert p.dtype == dtype
        # folding in half precision would round every intermediate product; we do not
        assert torch.equal(p, q.to(dtype)), name
