"""RepOpt-VGG: sizes, the multiplier, the rule of initialization, the scales files, the folds.

Exact reference values are counted from the RepOptimizers paper's Table 1 architectures; the
released scale files are ``../shared/repopt-scales`` (MIT). Equivalences are checked in float64
on tiny archs.
"""

import copy
import math
import os.path as osp

import pytest
import torch
import torch.nn as nn

import mmrepa
from mmrepa.backbones import RepOptVGG
from mmrepa.backbones.repopt_vgg import CSLAConvBN, RepOptConvBN
from mmrepa.engine.optimizers import collect_branch_scales
from mmrepa.errors import CheckpointError, ConfigError
from mmrepa.utils import complexity
from tests.helpers import REPOPT_VGG_TINY as TINY
from tests.helpers import ROOT, csla_model_like, random_scales, randomize_, target_scales

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 comparisons at 1e-4 ≈ 1680·u32 of the output's scale (u32 times the summed 3x3
# reductions, 9·C_in each, through the stages; observed ≤ 0.001 of it); float32 scales set to
# a float64 constant at rtol 1e-7 (one rounding, u32 = 6e-8).

SCALES = osp.join(osp.dirname(ROOT), 'shared', 'repopt-scales')


def scales_file(arch):
    path = osp.join(SCALES, f'RepOpt-VGG-{arch}-scales.pth')
    if not osp.exists(path):
        pytest.skip(f'{path} is not here (../shared/repopt-scales)')
    return path


def params(model):
    return sum(p.numel() for p in model.parameters())


# exact counts of the paper's Table 1 architectures: backbone only (no FC) and the FC of
# 1000 / 100 classes of the widest stage
@pytest.mark.parametrize(
    'arch, inference, training, hs_fc1000, hs_fc100, repvgg',
    [
        ('B1', 51_829_480, 51_841_832, 57_405_672, 55_561_572, 57_415_016),
        ('B2', 80_315_112, 80_330_536, 89_010_696, 86_705_796, 89_022_376),
        ('L1', 76_018_920, 76_037_928, 84_308_712, 82_464_612, 84_324_712),
        ('L2', 118_109_032, 118_132_776, 131_036_296, 128_731_396, 131_056_296),
    ],
)
def test_parameter_counts_equal_the_exact_counts_in_every_mode(
    arch, inference, training, hs_fc1000, hs_fc100, repvgg
):
    with torch.device('meta'):
        width = RepOptVGG(arch).num_features[-1]

        def fc(classes):
            return width * classes + classes

        assert params(RepOptVGG(arch, deploy=True)) + fc(1000) == inference
        assert params(RepOptVGG(arch)) + fc(1000) == training
        assert params(RepOptVGG(arch, mode='hs')) + fc(1000) == hs_fc1000
        assert params(RepOptVGG(arch, mode='hs')) + fc(100) == hs_fc100
        assert params(RepOptVGG(arch, mode='csla')) + fc(1000) == hs_fc1000
        assert params(RepOptVGG(arch, mode='repvgg')) + fc(1000) == repvgg


@pytest.mark.parametrize(
    'arch, gmacs, with_fc, backbone_params',
    [
        ('B1', 11.813, 11.815, 49_780_480),
        ('B2', 18.374, 18.377, 77_754_112),
        ('L1', 21.062, 21.064, 73_969_920),
        ('L2', 32.825, 32.827, 115_548_032),
    ],
)
def test_macs_equal_the_exact_counts(arch, gmacs, with_fc, backbone_params):
    """The folded backbone at 224 x 224, without and with the FC-1000 (Table 1, unrounded)."""
    model = RepOptVGG(arch, deploy=True, out_indices=(3,)).eval()
    counts = complexity(model, (torch.zeros(1, 3, 224, 224),))
    fc = model.num_features[-1] * 1000
    assert round(counts['macs'] / 1e9, 3) == gmacs
    assert round((counts['macs'] + fc) / 1e9, 3) == with_fc
    assert counts['params'] == backbone_params


def _csla(c_in, c_out, stride, seed):
    g = torch.Generator().manual_seed(seed)
    layer = CSLAConvBN(c_in, c_out, stride, trainable_scales=False).double()
    with torch.no_grad():
        for p in (layer.scale_conv.weight, layer.scale_1x1.weight):
            p.copy_(torch.randn(c_out, generator=g, dtype=torch.float64))
        layer.scale_conv.weight[0] = 0.0  # exact zeros and mixed signs
        layer.scale_1x1.weight[1] = 0.0
        layer.conv.weight.copy_(torch.randn(layer.conv.weight.shape, generator=g))
        layer.conv_1x1.weight.copy_(torch.randn(layer.conv_1x1.weight.shape, generator=g))
        if layer.has_identity:
            layer.scale_identity.weight.copy_(torch.randn(c_out, generator=g))
    return layer


def _target_like(csla):
    target = RepOptConvBN(csla.in_channels, csla.out_channels, csla.stride).double()
    scales = csla.scales()
    target.set_scales(
        scales['scale_conv.weight'], scales['scale_1x1.weight'], scales.get('scale_identity.weight')
    )
    return target


@pytest.mark.parametrize(
    'c_in, c_out, stride', [(3, 6, 2), (6, 10, 2), (6, 6, 1)], ids=['stem', 'stride-2', 'identity']
)
def test_multiplier_is_the_squared_jacobian_of_the_branches(c_in, c_out, stride):
    """M = diag(J Jᵀ), J = dW'/d(K, P, i) with s, t constant, and J Jᵀ is diagonal."""
    csla = _csla(c_in, c_out, stride, seed=c_in + c_out)
    names = ['conv.weight', 'conv_1x1.weight'] + (
        ['scale_identity.weight'] if csla.has_identity else []
    )
    own = dict(csla.named_parameters())

    class Kernel(nn.Module):  # W'(K, P, i) through the layer's own equivalent_kernel()
        def __init__(self):
            super().__init__()
            self.layer = csla

        def forward(self):
            return self.layer.equivalent_kernel()

    def kernel(*values):
        return torch.func.functional_call(
            Kernel(), {f'layer.{n}': v for n, v in zip(names, values)}, ()
        )

    jac = torch.autograd.functional.jacobian(kernel, tuple(own[n].detach() for n in names))
    n = csla.conv.weight.numel()
    J = torch.cat([j.reshape(n, -1) for j in jac], dim=1)
    JJt = J @ J.T
    assert torch.equal(JJt, torch.diag(torch.diagonal(JJt)))
    ((weight, branches),) = _target_like(csla).repopt_branch_scales().items()
    mult = (branches.double() ** 2).sum(0)
    # csla is float64; repopt_branch_scales gives its scales rounded once to float32, so mult's
    # entries are fl32(s)² (+ fl32(t)², + 1), each square within (1 + u32)² - 1 = 2u + u² of the
    # float64 one (u32 = 2^-24); float64 sums and differences of at most 3 such terms add 4·u64
    rounding = 2 * 2.0**-24 + 2.0**-48 + 4 * 2.0**-53
    torch.testing.assert_close(torch.diagonal(JJt).view(weight.shape), mult, rtol=rounding, atol=0)
    # the scales index output channels: s_c scales row c of M
    s = csla.scale_conv.weight
    torch.testing.assert_close(
        mult[:, :, 0, 0], (s**2).view(-1, 1).expand(-1, c_in).to(mult), rtol=rounding, atol=0
    )
    centre = mult[:, :, 1, 1] - mult[:, :, 0, 0]  # the float64 cancellation: u64 of the larger
    eye = torch.eye(c_out, c_in, dtype=mult.dtype) if csla.has_identity else 0
    expected = ((csla.scale_1x1.weight**2).view(-1, 1) + eye).expand_as(centre).to(mult)
    torch.testing.assert_close(
        centre, expected, rtol=rounding, atol=4 * 2.0**-53 * mult.abs().max().item()
    )


@pytest.mark.parametrize('identity_init', ['searched', 'one'])
def test_rule_of_initialization_starts_where_the_csla_block_starts(identity_init):
    """Step 0: the re-initialized target and the CSLA block with the same random kernels
    give the same outputs (train and eval mode), odd and even sizes, float64."""
    target = RepOptVGG(TINY, identity_init=identity_init).double()
    target.load_scales(random_scales(target, seed=1))
    target.reinitialize(torch.Generator().manual_seed(5))  # computed in float64
    csla = csla_model_like(target, 5)
    if identity_init == 'one':
        with torch.no_grad():
            for layer in csla.layers().values():
                if layer.has_identity:
                    layer.scale_identity.weight.fill_(1.0)
    target, csla = target.double(), csla.double()
    for mode in ('train', 'eval'):
        for m in (target, csla):
            m.train(mode == 'train')
        for shape in ((17, 13), (32, 32)):
            x = torch.randn(2, 3, *shape, dtype=torch.float64)
            for a, b in zip(target(x), csla(x)):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_rule_of_initialization_never_runs_over_trained_weights(tmp_path):
    model = RepOptVGG(TINY)
    model.train()(torch.randn(2, 3, 16, 16))  # BatchNorm statistics: the model has trained
    with pytest.raises(RuntimeError, match='from scratch'):
        model.init_weights()
    ckpt = tmp_path / 'target.pth'
    torch.save({'state_dict': model.state_dict()}, ckpt)
    loaded = RepOptVGG(TINY, init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)))
    loaded.init_weights()  # loads, does not re-initialize
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


@pytest.mark.parametrize('mode', ['target', 'hs', 'csla', 'repvgg'])
def test_every_mode_folds_exactly_into_the_deployed_network(mode):
    model = randomize_(RepOptVGG(TINY, mode=mode)).double().eval()
    deployed = RepOptVGG(TINY, deploy=True)
    for shape in ((17, 13), (24, 40)):
        x = torch.randn(2, 3, *shape, dtype=torch.float64)
        before = model(x)
        folded = mmrepa.reparameterize(copy.deepcopy(model))
        for a, b in zip(before, folded(x)):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10 * a.abs().max().item())
    assert folded.state_dict().keys() == deployed.state_dict().keys()
    deployed.load_state_dict(folded.float().state_dict())
    # fp32 too
    model32, x = model.float(), torch.randn(1, 3, 19, 21)
    out = model32(x)[-1]
    torch.testing.assert_close(
        mmrepa.reparameterize(copy.deepcopy(model32))(x)[-1],
        out,
        rtol=1e-4,
        atol=1e-4 * out.abs().max().item(),
    )


@pytest.mark.parametrize(
    'arch, tensors, floats',
    [('B1', 79, 34_048), ('B2', 79, 42_528), ('L1', 139, 54_016), ('L2', 139, 67_488)],
)
def test_released_scale_files_load_by_name(arch, tensors, floats):
    path = scales_file(arch)
    released = torch.load(path, weights_only=True)
    assert (len(released), sum(v.numel() for v in released.values())) == (tensors, floats)
    with torch.device('meta'):
        model = RepOptVGG(arch, mode='csla')
    model.to_empty(device='cpu')
    model.load_scales(path)
    assert model.export_scales().keys() == released.keys()
    for k, v in model.export_scales().items():
        assert torch.equal(v, released[k]), k


def test_released_b1_scales_have_the_documented_layout():
    released = torch.load(scales_file('B1'), weights_only=True)
    assert sum(int((v < 0).sum()) for v in released.values()) == 156
    mixed = sum(
        int((v * released[k.replace('scale_conv', 'scale_1x1')] < 0).sum())
        for k, v in released.items()
        if k.endswith('scale_conv.weight')
    )
    assert mixed == 90
    assert round(released['stage3.15.scale_conv.weight'].mean().item(), 4) == 0.3021
    # the multiplier they give: the largest centre-diagonal value is 10.3
    target = RepOptVGG('B1', scales=scales_file('B1'))
    largest = max(
        float((b.double() ** 2).sum(0)[:, :, 1, 1].max())
        for m in target.layers().values()
        for b in m.repopt_branch_scales().values()
    )
    assert round(largest, 1) == 10.3


def test_wrong_scales_are_refused_by_key(tmp_path):
    with pytest.raises(CheckpointError, match=r'stage1\.4\.scale_conv\.weight'):
        RepOptVGG('L1', mode='csla', scales=scales_file('B1'))  # B1 has 4 layers in stage 1
    with pytest.raises(
        CheckpointError,
        match=r'stage0\.scale_conv\.weight has shape \(64,\).*'
        r'another arch',
    ):
        RepOptVGG(dict(ARCH_B1_WIDER), scales=scales_file('B1'))
    partial = torch.load(scales_file('B1'), weights_only=True)
    del partial['stage2.3.scale_1x1.weight']
    torch.save(partial, tmp_path / 'partial.pth')
    with pytest.raises(CheckpointError, match=r'no scales for \[.stage2\.3\.scale_1x1\.weight'):
        RepOptVGG('B1', scales=str(tmp_path / 'partial.pth'))
    with pytest.raises(FileNotFoundError, match='nothing.pth') as err:
        RepOptVGG('B1', scales=str(tmp_path / 'nothing.pth'))
    assert 'model.backbone.scales' in str(err.value) and 'scales=None' in str(err.value)
    with pytest.raises(ConfigError, match="mode 'hs'"):
        RepOptVGG(TINY, mode='hs', scales=random_scales(RepOptVGG(TINY), 0))


ARCH_B1_WIDER = dict(depths=(4, 6, 16, 1), widths=(128, 256, 512, 2048), stem_width=32)


def test_a_hyper_search_checkpoint_is_scales_not_weights(tmp_path):
    hs = RepOptVGG(TINY, mode='hs')
    ckpt = tmp_path / 'hs.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in hs.state_dict().items()}}, ckpt)
    target = RepOptVGG(TINY, init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)))
    with pytest.raises(CheckpointError, match=r'Hyper-Search checkpoint.*scales=PATH'):
        target.init_weights()
    # given as scales, the whole checkpoint works, and export round-trips exactly
    target = RepOptVGG(TINY, scales=str(ckpt))
    assert target_scales(target).keys() == hs.export_scales().keys()
    for k, v in hs.export_scales().items():
        assert torch.equal(target_scales(target)[k], v), k


def test_deployed_checkpoints_and_training_ones_are_not_mixed_up():
    trained = RepOptVGG(TINY).eval()
    folded = mmrepa.reparameterize(copy.deepcopy(trained))
    with pytest.raises(CheckpointError, match='deploy=True'):
        RepOptVGG(TINY).load_state_dict(folded.state_dict())
    with pytest.raises(CheckpointError, match='unfolded'):
        RepOptVGG(TINY, deploy=True).load_state_dict(trained.state_dict())


def test_frozen_stages_and_outputs():
    model = RepOptVGG(TINY, frozen_stages=2, out_indices=(1, 3))
    model.train()
    assert not model.stage0.training and not model.stage2[0].training
    assert model.stage3[0].training
    assert all(not p.requires_grad for p in model.stage2.parameters())
    outs = model(torch.randn(1, 3, 64, 48))
    assert [tuple(o.shape) for o in outs] == [(1, 16, 8, 6), (1, 32, 2, 2)]  # strides 8, 32
    assert isinstance(model.norm1, nn.Identity)


def test_with_cp_changes_neither_gradients_nor_batchnorm_statistics():
    plain = RepOptVGG(TINY).double().train()
    cp = RepOptVGG(TINY, with_cp=True).double().train()
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 19, 17, dtype=torch.float64, requires_grad=True)
    for model in (plain, cp):
        sum(o.square().sum() for o in model(x)).backward()
    for (name, a), b in zip(plain.named_parameters(), cp.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12, msg=name)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(cp.state_dict()[k], v, rtol=0, atol=0, msg=k)


# --- the constants without scales=: the Hyper-Search model's initial values ---------------------

# a stage-2 first layer of stride 1 and unchanged width has an identity branch
HS_INIT_CASES = {
    'standard': (dict(depths=(4, 6, 3, 1), widths=(8, 16, 24, 32), stem_width=8), (2, 2, 2, 2, 2)),
    'stride-1 first layer': (
        dict(depths=(2, 3, 2, 1), widths=(8, 8, 16, 24), stem_width=8),
        (2, 2, 1, 2, 2),
    ),
}


def paper_initial_scales(arch, strides, in_channels=3):
    """{layer name: (s = t, i or None)} by the paper's rule, spelled out: in each stage the
    first layer that has an identity branch has depth l = 1, the next l = 2, ...; its s and t
    start at sqrt(2 / l); layers without identity branch (the stem, the first layer of a
    stage that changes width or has stride 2) start at 1; every identity scale at 1."""
    out = {'stage0': (1.0, 1.0 if in_channels == arch['stem_width'] and strides[0] == 1 else None)}
    previous = arch['stem_width']
    for k in range(4):
        depth = 0  # the paper's l
        for j in range(arch['depths'][k]):
            c_in = previous if j == 0 else arch['widths'][k]
            stride = strides[k + 1] if j == 0 else 1
            if c_in == arch['widths'][k] and stride == 1:
                depth = depth + 1
                out[f'stage{k + 1}.{j}'] = (math.sqrt(2.0 / depth), 1.0)
            else:
                out[f'stage{k + 1}.{j}'] = (1.0, None)
        previous = arch['widths'][k]
    return out


@pytest.mark.parametrize('case', sorted(HS_INIT_CASES))
@pytest.mark.parametrize('mode', ['target', 'hs', 'csla'])
def test_constants_start_at_the_hyper_search_initial_values(mode, case):
    arch, strides = HS_INIT_CASES[case]
    model = RepOptVGG(arch, mode=mode, strides=strides)
    expected = paper_initial_scales(arch, strides)
    assert sorted(model.layers()) == sorted(expected)
    for name, m in model.layers().items():
        st, identity = expected[name]
        assert m.has_identity == (identity is not None), name
        if mode == 'target':
            s, t, i = m.scale_conv, m.scale_1x1, m.scale_identity if m.has_identity else None
        else:
            s, t = m.scale_conv.weight, m.scale_1x1.weight
            i = m.scale_identity.weight if m.has_identity else None
        for got in (s, t):
            torch.testing.assert_close(
                got,
                torch.full_like(got, st),
                rtol=1e-7,
                atol=0,
                msg=f'{name}: {got[0].item()} instead of {st}',
            )
        if identity is not None:
            assert torch.equal(i, torch.ones_like(i)), name
    if case == 'standard':  # the numbers themselves: 1, sqrt(2), 1, sqrt(2/3), ...
        got = [
            float(m.scale_conv[0] if mode == 'target' else m.scale_conv.weight[0].detach())
            for m in model.stage2
        ]
        assert got == pytest.approx([1.0, 1.41421356, 1.0, 0.81649658, 0.70710678, 0.63245553])
    if mode == 'target' and case == 'standard':  # the multiplier they give: 2 / l off-centre
        layer = model.stage2[3]
        ((weight, branches),) = layer.repopt_branch_scales().items()
        torch.testing.assert_close(
            (branches**2).sum(0)[:, :, 0, 2], torch.full(weight.shape[:2], 2.0 / 3.0)
        )


def test_deploy_ignores_scales_and_does_not_read_them(tmp_path):
    missing = str(tmp_path / 'not-here.pth')  # never read
    for scales in (missing, random_scales(RepOptVGG(TINY), 0)):
        for mode in ('target', 'csla'):
            model = RepOptVGG(TINY, mode=mode, deploy=True, scales=scales)
            assert model.scales_source is None
            assert model.state_dict().keys() == RepOptVGG(TINY, deploy=True).state_dict().keys()
    with pytest.raises(ConfigError, match="mode 'hs'"):
        RepOptVGG(TINY, mode='hs', deploy=True, scales=missing)


def _without_constants(state_dict):
    """A target state dict as the official checkpoints have it: no scale_* buffers."""
    return {
        k: v
        for k, v in state_dict.items()
        if k.split('.')[-1] not in ('scale_conv', 'scale_1x1', 'scale_identity')
    }


def test_a_checkpoint_without_constants_needs_scales(tmp_path):
    trained = RepOptVGG(TINY)
    trained.load_scales(random_scales(trained, seed=4))
    trained.train()(torch.randn(2, 3, 16, 16))
    ckpt = str(tmp_path / 'official_target.pth')
    torch.save({'state_dict': _without_constants(trained.state_dict())}, ckpt)
    pretrained = dict(type='Pretrained', checkpoint=ckpt)

    # fine-tuning without scales=: an error naming the file and the option
    model = RepOptVGG(TINY, init_cfg=pretrained)
    with pytest.raises(
        CheckpointError,
        match=r'official_target\.pth has no RepOpt constants.*'
        r'model\.backbone\.scales',
    ):
        model.init_weights()
    # with them: the kernels load, the constants are those of scales=
    model = RepOptVGG(TINY, scales=target_scales(trained), init_cfg=pretrained)
    model.init_weights()
    for k, v in trained.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model.stage1[1].repopt_branch_scales()  # the optimizer may use them

    # a checkpoint that carries its constants, and scales= that differ from them
    full = str(tmp_path / 'mmrepa_target.pth')
    torch.save({'state_dict': trained.state_dict()}, full)
    model = RepOptVGG(
        TINY,
        scales=random_scales(trained, seed=5),
        init_cfg=dict(type='Pretrained', checkpoint=full),
    )
    with pytest.raises(
        CheckpointError,
        match=r'mmrepa_target\.pth carries RepOpt constants '
        r'that differ from scales=',
    ):
        model.init_weights()

    # load_from (mmengine loads non-strictly): training that kernel is refused, not run with
    # the initial constants; inference and folding do not need them
    model = RepOptVGG(TINY)
    model.load_state_dict(_without_constants(trained.state_dict()), strict=False)
    with pytest.raises(CheckpointError, match='without its constants.*model.backbone.scales'):
        collect_branch_scales(model)
    mmrepa.reparameterize(copy.deepcopy(model).eval())
    model.load_scales(target_scales(trained))
    assert len(collect_branch_scales(model)) == len(model.layers())


def test_a_trained_checkpoint_carries_its_constants_without_the_scales_file():
    """What the missing-scales message offers: scales=None, then the checkpoint's constants."""
    trained = RepOptVGG(TINY, scales=random_scales(RepOptVGG(TINY), 3))
    rebuilt = RepOptVGG(TINY, scales=None)
    assert not all(torch.equal(v, rebuilt.state_dict()[k]) for k, v in trained.state_dict().items())
    rebuilt.load_state_dict(trained.state_dict())
    for k, v in trained.state_dict().items():
        assert torch.equal(v, rebuilt.state_dict()[k]), k
