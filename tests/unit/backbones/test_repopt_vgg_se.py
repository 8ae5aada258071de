"""RepOpt-VGG with SE blocks (RepOpt-VGG-L2‡, the RepOptimizers paper's §4.1 and Table 3): the
block after every layer's ReLU in every form, its width, and the fold that keeps it.

Tolerances as test_repopt_vgg.py: float64 through a model 1e-10 of the largest output (u64 =
2^-53 times the size factor of its reductions); the SE block is not folded, so its tensors come
through bit for bit.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

import mmrepa
from mmrepa.backbones import RepOptVGG
from mmrepa.backbones.repopt_vgg import PostSE
from mmrepa.engine.optimizers import collect_branch_scales
from tests.helpers import REPOPT_VGG_TINY as TINY
from tests.helpers import randomize_

MODES = ['target', 'hs', 'csla', 'repvgg']


def written_out_se(y, se):
    """``y * sigmoid(W_up relu(W_down mean_hw(y) + b_down) + b_up)``, per sample, written out."""
    down = se.down.weight.flatten(1)
    up = se.up.weight.flatten(1)
    squeezed = y.mean((2, 3))
    gate = torch.sigmoid(F.relu(squeezed @ down.T + se.down.bias) @ up.T + se.up.bias)
    return y * gate[:, :, None, None]


def before_se(layer, x):
    """The layer's output without its SE block: ReLU of its (training or folded) conv-BN."""
    if layer.deploy:
        return F.relu(layer.conv(x))
    return F.relu(layer._forward_training(x))


@pytest.mark.parametrize('mode', MODES)
def test_the_se_block_follows_the_relu_of_every_layer_in_every_form(mode):
    """The released code's ``post_se(relu(bn(...)))``, in train and eval mode and folded."""
    model = randomize_(RepOptVGG(TINY, mode=mode, se=True)).double()
    x0 = torch.randn(2, 3, 17, 13, dtype=torch.float64)
    for form in ('train', 'eval', 'folded'):
        if form == 'folded':
            model = mmrepa.reparameterize(model.eval())
        else:
            model.train(form == 'train')
        x = x0
        for name, layer in model.layers().items():
            assert isinstance(layer.post_se, PostSE), name
            y = layer(x)
            expected = written_out_se(before_se(layer, x), layer.post_se)
            torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12, msg=f'{form} {name}')
            x = y


@pytest.mark.parametrize('mode', MODES)
def test_every_mode_with_se_folds_exactly_and_keeps_the_se_block(mode):
    model = randomize_(RepOptVGG(TINY, mode=mode, se=True)).double().eval()
    se_before = {k: v.clone() for k, v in model.state_dict().items() if '.post_se.' in k}
    deployed = RepOptVGG(TINY, deploy=True, se=True)
    for shape in ((17, 13), (24, 40)):
        x = torch.randn(2, 3, *shape, dtype=torch.float64)
        before = model(x)
        folded = mmrepa.reparameterize(copy.deepcopy(model))
        for a, b in zip(before, folded(x)):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10 * a.abs().max().item())
    assert folded.state_dict().keys() == deployed.state_dict().keys()
    for k, v in se_before.items():
        assert torch.equal(folded.state_dict()[k], v), k
    deployed.load_state_dict(folded.float().state_dict())
    assert all(isinstance(m.post_se, PostSE) for m in deployed.layers().values())


def test_se_width_is_a_quarter_and_its_weights_get_no_multiplier():
    """C // 4 as the released code: L2‡ adds 2·C·C/4 + C/4 + C per layer (stem included) to
    L2's counts, in every mode alike; the optimizer's branch scales are the kernels' only."""

    def se_params(c):
        return 2 * c * (c // 4) + c // 4 + c

    with torch.device('meta'):
        l2 = RepOptVGG('L2')
        added = se_params(64) + 8 * se_params(160) + 14 * se_params(320)
        added += 24 * se_params(640) + se_params(2560)
        assert added == 9_042_928
        for mode in MODES:
            plain = sum(p.numel() for p in RepOptVGG('L2', mode=mode).parameters())
            with_se = sum(p.numel() for p in RepOptVGG('L2', mode=mode, se=True).parameters())
            assert with_se - plain == added, mode
        folded = sum(p.numel() for p in RepOptVGG('L2', deploy=True, se=True).parameters())
        # L2's inference count with the FC-1000 (paper's Table 1) plus the SE blocks
        assert folded + l2.num_features[-1] * 1000 + 1000 == 118_109_032 + added
    target = RepOptVGG(TINY, se=True)
    kernels = {m.conv.weight for m in target.layers().values()}
    assert set(collect_branch_scales(target)) == kernels


def test_a_target_with_se_takes_the_scales_of_the_model_without_it(tmp_path):
    """The released code's Hyper-Search model has no SE: the L2 scales serve L2‡; a
    Hyper-Search checkpoint with SE blocks gives its scales and nothing else."""
    hs = randomize_(RepOptVGG(TINY, mode='hs', se=True))
    path = tmp_path / 'hs.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in hs.state_dict().items()}}, path)
    target = RepOptVGG(TINY, se=True, scales=str(path))
    plain = RepOptVGG(TINY, scales=hs.export_scales())
    for name, layer in target.layers().items():
        torch.testing.assert_close(layer.scale_conv, plain.layers()[name].scale_conv)
        torch.testing.assert_close(layer.scale_1x1, plain.layers()[name].scale_1x1)
