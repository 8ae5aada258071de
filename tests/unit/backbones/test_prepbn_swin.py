"""PRepBN-Swin / SLAB-Swin: structure, exact folding on any input size, checkpoints."""

import collections
import copy
import logging

import pytest
import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._python_dispatch import TorchDispatchMode

from mmrepa import reparameterize
from mmrepa.backbones import PRepBNSwin
from mmrepa.layers import PRepBN
from tests.helpers import TINY_ARCH, max_abs_diff, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# The float32 backbone fold (test_backbone_fold_is_close_in_float32) is measured against the
# float64 forward on the same weights and input: the folded float32 model must be as close to it
# as the unfolded float32 model is, up to a factor (see the test), so the bound follows the
# float32 error of this machine's kernels instead of one machine's number.

LINEAR_WINDOWS = (8, 6, 5, 3)  # small SLA windows, so that small inputs still pad
# sizes that are multiples of neither the windows nor 32
SIZES = [(75, 101), (33, 47)]


def tiny(dtype=torch.float64, **kw):
    kw.setdefault('drop_path_rate', 0.0)
    kw.setdefault('linear_window_sizes', LINEAR_WINDOWS)
    return randomize_(PRepBNSwin(arch=TINY_ARCH, **kw)).to(dtype).eval()


def norms(model):
    return [
        n for n, m in model.named_modules() if isinstance(m, (PRepBN, nn.LayerNorm, _BatchNorm))
    ]


def test_every_norm_inside_is_prepbn_and_the_outputs_are_layernorm():
    model = PRepBNSwin(arch=TINY_ARCH, attn_types='LLSS', linear_window_sizes=LINEAR_WINDOWS)
    top = [n for n, m in model.named_modules() if isinstance(m, PRepBN)]
    # patch embedding, 2 per block, 3 patch mergings
    assert len(top) == 1 + 2 * 8 + 3
    outputs = {f'norm{i}' for i in range(4)}
    assert {type(getattr(model, name)) for name in outputs} == {nn.LayerNorm}
    others = [n for n in norms(model) if n not in outputs and n not in top]
    assert others and all(any(n.startswith(p + '.') for p in top) for n in others)
    assert type(model.stages[0].blocks[0].attn.w_msa).__name__ == 'SimplifiedLinearAttention'
    assert type(model.stages[2].blocks[0].attn.w_msa).__name__ == 'WindowMSA'
    assert model.stages[0].window_size == 8 and model.stages[2].window_size == 7


@pytest.mark.parametrize('hw', SIZES)
@pytest.mark.parametrize('attn_types, idle', [('SSSS', 0.0), ('LLSS', 0.0), ('LLSS', 0.75)])
def test_backbone_fold_is_exact_in_float64(hw, attn_types, idle):
    model = tiny(attn_types=attn_types, idle_ratio=idle)
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    ref = model(x)
    folded = reparameterize(copy.deepcopy(model))
    assert max_abs_diff(folded(x), ref) <= 1e-10
    # nothing is left to normalise but the output LayerNorms
    assert norms(folded) == ['norm0', 'norm1', 'norm2', 'norm3']
    if idle:  # the channel-idle FFN folds to its three matrices
        ffn = folded.stages[1].blocks[0].ffn
        assert ffn.norm1 is None and {n for n, _ in ffn.named_children()} == {
            'act',
            'in_proj',
            'out_proj',
        }


@pytest.mark.parametrize('attn_types', ['SSSS', 'LLSS'])
def test_backbone_fold_is_close_in_float32(attn_types):
    """Folded and unfolded float32 models evaluate one function with rounding errors of one
    kind (the folded one runs fewer operations and rounds each folded weight once more, u|W|),
    so against the float64 forward on the same data the folded one errs by the unfolded one's
    error times a small factor: 4 covers two draws of that error (the ratio stays within
    0.2-2.0 over 8 seeds, both attention layouts) plus one rounding of the output, u max|y|.
    The simplified linear attention makes stage 0 ill-conditioned (errors ~1e3 u), which a
    fixed tolerance would have to fit; a wrong fold term moves outputs by 1e-3 or more."""
    model = tiny(torch.float32, attn_types=attn_types)
    x = torch.randn(1, 3, 75, 101)
    exact = copy.deepcopy(model).double()(x.double())
    unfolded = model(x)
    folded = reparameterize(copy.deepcopy(model))(x)
    u = 2.0**-24
    for y, r, o in zip(exact, unfolded, folded):
        bound = 4 * (r.double() - y).abs().max().item() + u * y.abs().max().item()
        assert (o.double() - y).abs().max().item() <= bound


def test_deploy_round_trip_and_idempotence():
    model = tiny(attn_types='LLSS', idle_ratio=0.5)
    x = torch.randn(1, 3, 61, 90, dtype=torch.float64)
    ref = model(x)
    reparameterize(model)
    state = copy.deepcopy(model.state_dict())
    reparameterize(model)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    deployed = (
        PRepBNSwin(
            arch=TINY_ARCH,
            attn_types='LLSS',
            idle_ratio=0.5,
            linear_window_sizes=LINEAR_WINDOWS,
            deploy=True,
        )
        .double()
        .eval()
    )
    deployed.load_state_dict(state)  # strict: same structure, padded_qkv included
    assert max_abs_diff(deployed(x), ref) <= 1e-10


def test_lambda_is_unaffected_by_with_cp_and_extra_forwards():
    torch.manual_seed(1)
    plain = PRepBNSwin(arch=TINY_ARCH, drop_path_rate=0.0).train()
    cp = PRepBNSwin(arch=TINY_ARCH, drop_path_rate=0.0, with_cp=True).train()
    cp.load_state_dict(plain.state_dict())
    for model in (plain, cp):
        for layer in model.prepbn_layers():
            layer.set_lambda(0.37)
    x = torch.randn(2, 3, 64, 80)
    for model in (plain, cp):
        for _ in range(2):  # an extra forward and backward, recomputed blocks under with_cp
            model.zero_grad()
            sum(o.sum() for o in model(x)).backward()
    for model in (plain, cp):
        assert {layer.current_lambda for layer in model.prepbn_layers()} == {0.37}
        assert all(float(layer.lam) == pytest.approx(0.37) for layer in model.prepbn_layers())
    for (n, p), q in zip(plain.named_parameters(), cp.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)
    # the recomputed blocks do not count their batches twice in the BatchNorm statistics
    cp_state = cp.state_dict()
    for k, v in plain.state_dict().items():
        if k.endswith(('running_mean', 'running_var', 'num_batches_tracked')):
            torch.testing.assert_close(cp_state[k], v, msg=k)


def test_norm_eval_freezes_the_statistics_inside_prepbn():
    model = PRepBNSwin(arch=TINY_ARCH, norm_eval=True).train()
    layer = model.stages[1].blocks[0].norm1
    assert layer.training and not layer.repbn.bn.training
    before = layer.repbn.bn.running_mean.clone()
    model(torch.randn(2, 3, 64, 64))
    assert torch.equal(before, layer.repbn.bn.running_mean)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(attn_types='LLS'), r'attn_types must have one letter per stage \(4\)'),
        (dict(attn_types='LLXS'), r"'S' \(softmax attention\) or 'L'"),
        (
            dict(attn_types='LLSS', linear_window_sizes=(56, 28)),
            'linear_window_sizes has 2 entries but the arch has 4 stages',
        ),
        (dict(prepbn_cfg=dict(type='LN')), 'prepbn_cfg must build a norm that is affine'),
    ],
)
def test_bad_options_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PRepBNSwin(arch=TINY_ARCH, **kwargs)


# ---- checkpoints -----------------------------------------------------------------------------

SWIN_KW = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def pretrained(tmp_path, state_dict, **kw):
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': state_dict}, path)
    kw.setdefault('drop_path_rate', 0.0)
    kw.setdefault('linear_window_sizes', LINEAR_WINDOWS)
    model = PRepBNSwin(arch=TINY_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path)), **kw)
    model.init_weights()
    return model


def warnings_of(fn):
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        result = fn()
    finally:
        logger.removeHandler(handler)
    return result, '\n'.join(records)


def test_mmdet_swin_checkpoint_fills_the_layernorm_branches(tmp_path):
    from mmdet.models.backbones import SwinTransformer

    ref = randomize_(SwinTransformer(**SWIN_KW, drop_path_rate=0.0))
    ref.eval()
    state = {'backbone.' + k: v for k, v in ref.state_dict().items()}
    ours, log = warnings_of(lambda: pretrained(tmp_path, state))
    assert 'LayerNorm checkpoint' in log and 'RepBN branches of 20 PRepBN layers' in log
    assert torch.equal(
        ours.stages[0].blocks[1].ffn.norm1.ln.weight, ref.stages[0].blocks[1].norm2.weight
    )
    ours.train()  # lambda = 1: pure LayerNorm, the network the checkpoint was trained as
    x = torch.randn(2, 3, 75, 101)
    with torch.no_grad():
        assert max_abs_diff(ours(x), ref(x)) < 1e-5


def test_layernorm_checkpoint_with_norm_eval_is_an_error(tmp_path):
    from mmdet.models.backbones import SwinTransformer

    state = SwinTransformer(**SWIN_KW).state_dict()
    with pytest.raises(ValueError, match='norm_eval=True would keep them there'):
        pretrained(tmp_path, state, norm_eval=True)


def _to_slab_layout(state_dict, total_step=1000):
    """mmrepa names -> SLAB's release: original Swin layout with LinearNorm norms."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith(('norm0.', 'norm1.', 'norm2.')):
            continue
        k = k.replace('patch_embed.projection.', 'patch_embed.proj.')
        k = k.replace('.ffn.norm1.', '.norm2.').replace('.ffn.fc', '.mlp.fc')
        k = k.replace('.attn.w_msa.', '.attn.').replace('norm3.', 'norm.')
        k = k.replace('.ln.', '.norm1.').replace('.repbn.bn.', '.norm2.bn.')
        k = k.replace('.repbn.eta', '.norm2.alpha')
        if k.startswith('stages.'):
            k = 'layers.' + k[len('stages.') :]
            if '.downsample.' in k and v.dim() >= 1 and v.shape[-1] % 4 == 0 and v.numel() > 1:
                lead, C = v.shape[:-1], v.shape[-1] // 4  # unfold order -> concat order
                v = v.reshape(*lead, C, 4).transpose(-1, -2)[..., [0, 2, 1, 3], :]
                v = v.reshape(*lead, 4 * C)
        if k.endswith('.lam'):
            out[k[: -len('lam')] + 'iter'] = torch.tensor(round(float(v) * total_step))
            out[k[: -len('lam')] + 'total_step'] = torch.tensor(total_step)
            continue
        out[k] = v
    return out


def test_slab_linear_norm_checkpoint_round_trip(tmp_path):
    src = tiny(torch.float32, attn_types='LLSS', out_indices=(3,))
    for layer in src.prepbn_layers():
        layer.set_lambda(0.25)
    state = _to_slab_layout(src.state_dict())
    assert 'layers.0.blocks.1.norm1.norm2.bn.running_var' in state
    assert 'layers.0.downsample.norm.norm2.alpha' in state
    ours = pretrained(tmp_path, state, attn_types='LLSS', out_indices=(3,)).eval()
    assert {layer.current_lambda for layer in ours.prepbn_layers()} == {0.25}
    x = torch.randn(1, 3, 90, 70)
    with torch.no_grad():
        assert max_abs_diff(ours(x), src(x)) < 1e-4


@pytest.mark.parametrize('slab_layout', [False, True])
def test_missing_bn_statistics_are_an_error(tmp_path, slab_layout):
    state = tiny(torch.float32).state_dict()
    del state['stages.1.blocks.0.norm1.repbn.bn.running_var']
    if slab_layout:
        state = _to_slab_layout(state)
    with pytest.raises(KeyError, match=r'stages\.1\.blocks\.0\.norm1\.repbn\.bn\.running_var'):
        pretrained(tmp_path, state)


def test_folded_checkpoint_loads_into_a_deploy_model(tmp_path):
    src = tiny(torch.float32, attn_types='LLSS')
    folded = reparameterize(copy.deepcopy(src))
    ours = pretrained(tmp_path, folded.state_dict(), attn_types='LLSS', deploy=True).eval()
    x = torch.randn(1, 3, 45, 60)
    with torch.no_grad():
        assert max_abs_diff(ours(x), src(x)) < 1e-4
    with pytest.raises(ValueError, match='folded weights.*Build it with deploy=True'):
        pretrained(tmp_path, folded.state_dict(), attn_types='LLSS')


def test_positional_encodings_of_another_window_are_resized(tmp_path):
    state = PRepBNSwin(
        arch=TINY_ARCH, attn_types='LLSS', linear_window_sizes=(16, 8, 5, 3)
    ).state_dict()
    key = 'stages.0.blocks.0.attn.w_msa.positional_encoding'
    assert state[key].shape == (1, 256, 16)
    # channel c holds c * row: the resized encoding must too (rows, not columns, not channels)
    row = torch.arange(16.0).view(16, 1, 1).expand(16, 16, 16)
    state[key] = (row * torch.arange(16.0)).reshape(1, 256, 16)
    ours = pretrained(tmp_path, state, attn_types='LLSS')
    grid = ours.state_dict()[key].view(8, 8, 16)
    assert torch.allclose(grid, grid[:, :1].expand(8, 8, 16), atol=1e-4)  # same along columns
    assert (grid[1:, 0, 1] > grid[:-1, 0, 1]).all()
    torch.testing.assert_close(grid[:, 0, 2], 2 * grid[:, 0, 1])
    assert not grid[:, :, 0].any()


class OpCounter(TorchDispatchMode):
    """Counts the aten ops a forward runs, by name (the latency proxy a unit test can check)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_folding_removes_every_norm_computation_inside_the_network():
    """Where the latency drop comes from: after folding, no BatchNorm and no LayerNorm runs
    but the four output norms, and the forward runs fewer ops (timed with tools/benchmark.py,
    not here)."""
    model = tiny(torch.float32, attn_types='LLSS')
    folded = reparameterize(copy.deepcopy(model))
    x = torch.randn(1, 3, 75, 101)
    counts = []
    for m in (model, folded):
        with torch.no_grad(), OpCounter() as counter:
            m(x)
        counts.append(counter.ops)
    before, after = counts
    norm_ops = (
        'native_batch_norm',
        '_native_batch_norm_legit_no_training',
        'batch_norm',
        'native_layer_norm',
        'layer_norm',
    )
    assert sum(before[op] for op in norm_ops) == 20 + 4  # 20 PRepBNs (eval: RepBN) + outputs
    assert sum(after[op] for op in norm_ops) == 4
    assert sum(after.values()) < sum(before.values())
