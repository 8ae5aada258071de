"""PRepBN-PVT and SLAB-PVT: mmdet's PVT at λ = 1, SLAB-PVT's linear attention against its
formula from a checkpoint in SLAB's layout, exact folding on awkward sizes, checkpoints, bad
input."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmrepa import fold_model
from mmrepa.backbones import PRepBNPVT, PRepBNSwin
from mmrepa.engine.hooks import PRepBNScheduleHook
from mmrepa.errors import CheckpointError, ConfigError
from mmrepa.layers import PRepBN
from tests.helpers import TINY_ARCH, max_relative, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 fold at 1e-5 ≈ 168·u32 of the output's scale: u32 times a size factor of the
# reductions through the stages in two orders; observed ≤ 0.06 of it on both kernel settings.

# mmdet's argument names; 8 channels per head, stage widths 8, 16, 16, 32
KW = dict(embed_dims=8, num_layers=[1, 2, 1, 1], num_heads=[1, 2, 2, 4], pretrain_img_size=224)
SIZE = (2, 3, 75, 83)  # odd sides: every patch embedding and reduction drops a remainder


def mmdet_pvt(**kw):
    from mmdet.models.backbones import PyramidVisionTransformer

    torch.manual_seed(0)
    return randomize_(PyramidVisionTransformer(**KW, drop_path_rate=0.0, **kw)).double()


def ours(**kw):
    return PRepBNPVT(**KW, drop_path_rate=0.0, **kw).double()


def load(model, state_dict, tmp_path):
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': state_dict}, path)
    model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model.init_weights()
    return model


def to_release(ref):
    """mmdet's PVT state dict written back in the PVT release's names (the inverse of mmdet's
    ``pvt_convert``), plus a class token and head the converter must drop."""
    out = {'cls_token': torch.zeros(1, 1, 32), 'head.weight': torch.zeros(10, 32)}
    for i, (embed, layers, _) in enumerate(ref.layers):
        s = i + 1
        for k, v in embed.state_dict().items():
            out[f'patch_embed{s}.' + k.replace('projection.', 'proj.')] = v
        pos = layers[0].pos_embed
        out[f'pos_embed{s}'] = torch.cat([pos[:, :1], pos], 1) if s == 4 else pos
        for j, block in enumerate(layers[1:]):
            for k, v in block.state_dict().items():
                p = f'block{s}.{j}.'
                if 'in_proj_' in k:
                    leaf, C = k.rsplit('_', 1)[1], v.shape[0] // 3
                    out[p + 'attn.q.' + leaf], out[p + 'attn.kv.' + leaf] = v[:C], v[C:]
                elif 'out_proj' in k:
                    out[p + 'attn.proj.' + k.rsplit('.', 1)[1]] = v
                elif k.startswith('ffn.layers.'):
                    idx, leaf = k[len('ffn.layers.') :].split('.')
                    fc = 'fc1' if idx == '0' else 'fc2'
                    out[f'{p}mlp.{fc}.{leaf}'] = v.flatten(1) if v.dim() == 4 else v
                else:
                    out[p + k] = v
    return out


def test_lambda_one_is_mmdets_pvt_from_the_same_weights_in_any_layout(tmp_path):
    """mmdet format (also a whole detector's) and the PVT release format (read by mmdet's own
    pvt_convert into the reference) load through init_cfg; at λ = 1 in training mode every
    PRepBN is its LayerNorm and the backbone is mmdet's, to 1e-10 in float64."""
    from mmdet.models.backbones.pvt import pvt_convert

    ref = mmdet_pvt().train()
    x = torch.randn(SIZE, dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x)
        detector = {'backbone.' + k: v for k, v in ref.state_dict().items()}
        model = load(ours(), detector, tmp_path).train()
        assert max_relative(model(x), expected) < 1e-10
        release = to_release(ref)
        again = mmdet_pvt()
        again.load_state_dict(pvt_convert(release))
        model = load(ours(), release, tmp_path).train()
        converted = again.train()(x)
        assert max_relative(model(x), converted) < 1e-10
    assert torch.equal(
        model.stages[1].blocks[1].ffn.norm1.ln.weight, ref.layers[1][1][2].norm2.weight
    )


def test_prepbn_schedule_hook_drives_every_norm():
    model = ours()
    layers = PRepBNScheduleHook(decay_iters=10).find_layers(model)
    # per stage: patch embedding + per block norm1, FFN norm, and the reduction's norm (not in
    # the last stage, sr_ratio 1)
    assert len(layers) == 4 + 2 * 5 + 4
    assert not [
        k for k, m in model.named_modules() if isinstance(m, nn.LayerNorm) and '.ln' not in k
    ]


@pytest.mark.parametrize(
    'paddings, attn_types', [((0, 0, 0, 0), None), ((1, 1, 0, 1), None), ((1, 1, 0, 1), 'LLSL')]
)
def test_fold_is_exact_and_leaves_no_norm(paddings, attn_types, tmp_path):
    """Linear attention on maps other than its positional encoding's (56 x 56 at 224 px,
    resized), non-square, its depthwise conv padding ``v`` at the borders."""
    kw = dict(paddings=paddings, patch_sizes=(5, 3, 2, 2), idle_ratio=0.5, attn_types=attn_types)
    model = randomize_(ours(**kw)).eval()
    x = torch.randn(SIZE, dtype=torch.float64)
    with torch.no_grad():
        before = model(x)
        fold_model(model, logger=None)
        after = model(x)
    assert max_relative(after, before) < 1e-10
    assert not [m for m in model.modules() if isinstance(m, (PRepBN, nn.LayerNorm))]
    deployed = ours(**kw, deploy=True)
    detector = {'backbone.' + k: v for k, v in model.state_dict().items()}
    load(deployed, detector, tmp_path)  # the folded checkpoint of a whole detector
    with torch.no_grad():
        assert max_relative(deployed.eval()(x), after) == 0


@pytest.mark.parametrize('attn_types', [None, 'LLLL'])
def test_fold_is_close_in_float32(attn_types):
    """PVT's init with random norms (all random weights make the residual stream ~1e7)."""
    model = ours(attn_types=attn_types).float()
    for m in model.modules():
        if isinstance(m, PRepBN):
            randomize_(m)
    x = torch.randn(SIZE)
    with torch.no_grad():
        before = model.eval()(x)
        fold_model(model, logger=None)
        assert max_relative(model(x), before) < 1e-5


def test_a_mmdet_pvt_config_switches_by_its_type_alone(tmp_path):
    from mmdet.registry import MODELS
    from mmengine.config import Config

    path = tmp_path / 'config.py'
    path.write_text(
        "_base_ = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'\n"
        "model = dict(backbone=dict(type='PRepBNPVT'))\n"
    )
    cfg = Config.fromfile(str(path)).model.backbone
    backbone = MODELS.build(cfg)
    assert [len(s.blocks) for s in backbone.stages] == [2, 2, 2, 2]
    assert backbone.num_features == [64, 128, 320, 512]
    assert backbone.init_cfg == dict(cfg.init_cfg, type='Pretrained')


def test_layernorm_checkpoint_of_another_size_or_family_is_refused(tmp_path):
    bigger = dict(KW, num_layers=[1, 3, 1, 1])
    with pytest.raises(CheckpointError, match=r'stages\.1\.blocks\.2\..*another size'):
        load(ours(), PRepBNPVT(**bigger).state_dict(), tmp_path)
    swin = PRepBNSwin(arch=TINY_ARCH, window_size=3).state_dict()
    with pytest.raises(CheckpointError, match='another size or family|lacks'):
        load(ours(), swin, tmp_path)


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='huge'), r"unknown arch 'huge'; choose one of \['medium', 'small', 'tiny'\]"),
        (dict(norm_cfg=dict(type='BN')), r"norm_cfg=.*only norm_cfg=dict\(type='LN'"),
        (dict(use_conv_ffn=True), r'use_conv_ffn=True \(a PVTv2 option\)'),
        (dict(norm_after_stage=True), r'norm_after_stage=True \(a PVTv2 option\)'),
        (dict(arch='small', num_layers=[2, 2, 2, 2]), r"arch='small' has num_layers"),
        (dict(sr_ratios=(8, 4, 2)), r'sr_ratios has 3 entries'),
        (dict(patch_sizes=(4, 2, 2, 2, 2)), r'patch_sizes has 5 entries but the arch has 4'),
        (dict(attn_types='LLL'), r"attn_types must have one letter per stage \(4\).*'LLL'"),
        (dict(attn_types='LLXS'), r"attn_types must have one letter per stage \(4\).*'LLXS'"),
    ],
)
def test_bad_options_say_what_is_wrong_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        PRepBNPVT(**kwargs)
    assert '\n' not in str(info.value)


def test_one_value_of_a_per_stage_option_serves_every_stage():
    torch.manual_seed(0)
    one = ours(paddings=0, sr_ratios=2)
    torch.manual_seed(0)
    each = ours(paddings=(0, 0, 0, 0), sr_ratios=(2, 2, 2, 2))
    assert repr(one) == repr(each)
    assert all(
        torch.equal(a, b) for a, b in zip(one.state_dict().values(), each.state_dict().values())
    )


# ----------------------------------------------------------------- SLAB-PVT in SLAB's layout

DIMS, HEADS, DEPTHS = (8, 16, 16, 32), (1, 2, 2, 4), (1, 2, 1, 1)
SLAB_IMAGE = (64, 96)  # the pretraining size: SLAB's positional encodings fit it as they are


def slab_pvt_state_dict():
    """Random tensors under the names SLAB's slab_pvt.py saves (LinearNorm norms with their
    step counters, separate ``q`` and ``kv``, a 5 x 5 ``dwc`` of head_dim channels, per-stage
    positional encodings of the whole map, no class token, a head)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    out = {'head.weight': r(10, DIMS[-1]), 'head.bias': r(10)}

    def linear_norm(p, C):
        out.update({p + '.norm1.weight': 1 + r(C), p + '.norm1.bias': r(C)})
        out.update({p + '.norm2.alpha': 1 + r(1), p + '.norm2.bn.weight': 1 + r(C)})
        out.update({p + '.norm2.bn.bias': r(C), p + '.norm2.bn.running_mean': r(C)})
        out[p + '.norm2.bn.running_var'] = 0.5 + torch.rand(C, generator=g, dtype=torch.float64)
        out[p + '.norm2.bn.num_batches_tracked'] = torch.tensor(7)
        out.update({p + '.warm': torch.tensor(0), p + '.iter': torch.tensor(0)})
        out[p + '.total_step'] = torch.tensor(300000)

    c_in, side = 3, 1
    for s, (C, h, depth) in enumerate(zip(DIMS, HEADS, DEPTHS), 1):
        k = 4 if s == 1 else 2
        side *= k
        N = (SLAB_IMAGE[0] // side) * (SLAB_IMAGE[1] // side)
        out.update(
            {f'patch_embed{s}.proj.weight': r(C, c_in, k, k), f'patch_embed{s}.proj.bias': r(C)}
        )
        linear_norm(f'patch_embed{s}.norm', C)
        out[f'pos_embed{s}'] = r(1, N, C)
        hidden = C * (8 if s < 3 else 4)
        for j in range(depth):
            p = f'block{s}.{j}.'
            linear_norm(p + 'norm1', C)
            linear_norm(p + 'norm2', C)
            for name, shape in [
                ('attn.q', (C, C)),
                ('attn.kv', (2 * C, C)),
                ('attn.proj', (C, C)),
                ('mlp.fc1', (hidden, C)),
                ('mlp.fc2', (C, hidden)),
            ]:
                out[f'{p}{name}.weight'], out[f'{p}{name}.bias'] = r(*shape), r(shape[0])
            d = C // h
            out[p + 'attn.dwc.weight'], out[p + 'attn.dwc.bias'] = r(d, 1, 5, 5), r(d)
            out[p + 'attn.positional_encoding'] = r(1, N, C)
        c_in = C
    return out


def slab_pvt_reference(sd, x, bn_eps):
    """SLAB-PVT's eval-mode forward written naively from ``sd`` (SLAB's names): RepBN is
    ``BN(x) + alpha x``; per head ``relu(q) relu(k)ᵀ v / (relu(q) Σ relu(k)ᵀ + 1e-6)`` as the
    (N, N) product, plus the depthwise conv of ``v`` on the map. On another input size the
    position embeddings (bilinear, as SLAB's PVT) and the positional encodings (bicubic) are
    resized as (h, w) images of the pretraining map."""

    def repbn(p, t):
        bn = (t - sd[p + '.norm2.bn.running_mean']) / torch.sqrt(
            sd[p + '.norm2.bn.running_var'] + bn_eps
        )
        return (
            bn * sd[p + '.norm2.bn.weight'] + sd[p + '.norm2.bn.bias'] + sd[p + '.norm2.alpha'] * t
        )

    def linear(p, t):
        return t @ sd[p + '.weight'].T + sd[p + '.bias']

    def resized(pe, grid, hw, mode):
        image = pe.transpose(1, 2).reshape(1, -1, *grid)
        return F.interpolate(image, size=hw, mode=mode).flatten(2).transpose(1, 2)

    outs, side = [], 1
    for s, (C, h, depth) in enumerate(zip(DIMS, HEADS, DEPTHS), 1):
        w = sd[f'patch_embed{s}.proj.weight']
        x = F.conv2d(x, w, sd[f'patch_embed{s}.proj.bias'], stride=w.shape[-1])
        B, _, H, W = x.shape
        side *= w.shape[-1]
        grid = (SLAB_IMAGE[0] // side, SLAB_IMAGE[1] // side)
        pos = resized(sd[f'pos_embed{s}'], grid, (H, W), 'bilinear')
        t = repbn(f'patch_embed{s}.norm', x.flatten(2).transpose(1, 2)) + pos
        for j in range(depth):
            p, d = f'block{s}.{j}.', C // h
            u = repbn(p + 'norm1', t)
            q = F.relu(linear(p + 'attn.q', u))
            k, v = linear(p + 'attn.kv', u).split(C, dim=-1)
            k = F.relu(k + resized(sd[p + 'attn.positional_encoding'], grid, (H, W), 'bicubic'))
            heads = []
            for i in range(h):
                qi, ki, vi = (a[..., i * d : (i + 1) * d] for a in (q, k, v))
                den = qi @ ki.sum(1, keepdim=True).transpose(1, 2) + 1e-6
                local = F.conv2d(
                    vi.transpose(1, 2).reshape(B, d, H, W),
                    sd[p + 'attn.dwc.weight'],
                    sd[p + 'attn.dwc.bias'],
                    padding=2,
                    groups=d,
                )
                heads.append(
                    (qi @ ki.transpose(1, 2)) @ vi / den + local.flatten(2).transpose(1, 2)
                )
            t = t + linear(p + 'attn.proj', torch.cat(heads, -1))
            t = t + linear(p + 'mlp.fc2', F.gelu(linear(p + 'mlp.fc1', repbn(p + 'norm2', t))))
        x = t.transpose(1, 2).reshape(B, C, H, W)
        outs.append(x)
    return outs


def slab_pvt(**kw):
    arch = dict(embed_dims=8, num_layers=DEPTHS, num_heads=HEADS)
    return PRepBNPVT(arch, pretrain_img_size=SLAB_IMAGE, attn_types='LLLL', **kw).double()


def test_slab_pvt_checkpoint_is_slabs_formula(tmp_path):
    """A checkpoint in SLAB's slab_pvt.py layout loads whole (q and kv joined into qkv, the
    step counters read as λ, the head dropped) and the backbone computes SLAB-PVT's formula,
    unfolded and folded, on a non-square map (the depthwise conv sees the rows in order)."""
    sd = slab_pvt_state_dict()
    model = slab_pvt(drop_path_rate=0.0)
    assert set(model.filter_checkpoint(dict(sd))) == set(model.state_dict())
    load(model, sd, tmp_path).eval()
    assert {layer.current_lambda for layer in model.prepbn_layers()} == {0.0}
    bn_eps = model.patch_embed.norm.repbn.bn.eps  # SLAB's BatchNorm1d has 1e-5, see the docs
    images = [torch.randn(2, 3, *hw, dtype=torch.float64) for hw in (SLAB_IMAGE, (96, 80))]
    with torch.no_grad():
        expected = [slab_pvt_reference(sd, x, bn_eps) for x in images]
        for x, ref in zip(images, expected):
            assert max_relative(model(x), ref) < 1e-10
        fold_model(model, logger=None)
        for x, ref in zip(images, expected):
            assert max_relative(model(x), ref) < 1e-10


def test_only_the_linear_norms_step_counters_are_read_other_warm_keys_are_unexpected(tmp_path):
    """SLAB's LinearNorms keep ``warm`` / ``iter`` / ``total_step`` buffers, which become λ; a
    ``warm`` key of anything else (a layer, a submodule of a LinearNorm) is not theirs."""
    sd = slab_pvt_state_dict()
    sd['block1.0.attn.warm'] = torch.tensor(1)  # a layer that is no LinearNorm
    sd['block1.0.norm1.norm1.warm'] = torch.tensor(1)  # inside a LinearNorm, not its counter
    path = tmp_path / 'slab.pth'
    torch.save({'state_dict': sd}, path)
    report = slab_pvt().load_pretrained(str(path))
    assert sorted(k for k in report.unexpected if k.endswith('.warm')) == [
        'stages.0.blocks.0.attn.warm',
        'stages.0.blocks.0.norm1.norm1.warm',
    ]


def test_a_checkpoint_of_another_attention_kind_names_attn_types(tmp_path):
    """A softmax PRepBN-PVT checkpoint for SLAB-PVT lacks the linear attention's weights: the
    error names the stages and attn_types; keys missing for another reason keep the list."""
    arch = dict(embed_dims=8, num_layers=(1, 1, 1, 1), num_heads=(1, 1, 2, 2))
    sd = PRepBNPVT(arch, attn_types='SSSS').state_dict()
    path = tmp_path / 'softmax.pth'
    torch.save({'state_dict': sd}, path)
    with pytest.raises(CheckpointError) as err:
        PRepBNPVT(arch, attn_types='SSLL').load_pretrained(str(path))
    message = str(err.value)
    assert "another attention than this PRepBNPVT (attn_types='SSLL') in stage(s) 2, 3:" in message
    assert "stage 2's has kv, norm, q, sr where the model's has dwc, positional_encoding, qkv" in (
        message
    )
    del sd['stages.1.blocks.0.ffn.fc1.weight']
    torch.save({'state_dict': sd}, path)
    with pytest.raises(CheckpointError, match=r'lacks 1 weight.*stages\.1\.blocks\.0\.ffn'):
        PRepBNPVT(arch, attn_types='SSSS').load_pretrained(str(path))


def test_linear_attention_stages_reduce_nothing():
    """An 'L' stage ignores its sr_ratio: it does not bound the input size."""
    kw = dict(KW, sr_ratios=(16, 4, 2, 1))
    assert PRepBNPVT(**kw).min_input_size == 64
    assert PRepBNPVT(**kw, attn_types='LSSS').min_input_size == 32
