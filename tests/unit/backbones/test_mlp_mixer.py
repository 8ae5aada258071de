"""MLPMixer: timm and mmpretrain parity, checkpoints, folds, counts against RePaFormer's
Table 1, options."""

import copy

import pytest
import torch

from mmrepa import reparameterize
from mmrepa.backbones import MLPMixer, RePaSwin
from mmrepa.backbones.mlp_mixer import ARCH_SETTINGS
from mmrepa.errors import CheckpointError, ConfigError, InputError
from mmrepa.layers import ChannelIdleFFN
from tests.helpers import TINY_ARCH, max_abs_diff, max_relative, randomize_

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 fold at 1e-5 ≈ 168·u32 of the output's scale: u32 times a size factor of the token-
# and channel-mixing reductions in two orders; observed ≤ 0.04 of it on both kernel settings.

# awkward sizes: 5x7 patches of 8 (35 tokens), hidden widths 10 and 56 (idle 0.7 leaves
# ceil(16.8) = 17 active channels), three blocks
TINY = dict(embed_dims=24, num_layers=3, tokens_mlp_dims=10, channels_mlp_dims=56, patch_size=8)
IMG = (40, 56)
PUBLISHED = dict(idle_ratio=0.0, ffn_norm='LN')


def tiny(**kw):
    kw.setdefault('img_size', IMG)
    return randomize_(MLPMixer(TINY, **kw)).double().eval()


def image(batch=2):
    return torch.randn(
        batch, 3, *IMG, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )


def pretrained(tmp_path, state_dict, **kw):
    """A tiny MLPMixer built with ``init_cfg=Pretrained`` on ``state_dict`` saved to a file."""
    path = str(tmp_path / 'ckpt.pth')
    torch.save(state_dict, path)
    kw.setdefault('img_size', IMG)
    model = MLPMixer(TINY, init_cfg=dict(type='Pretrained', checkpoint=path), **kw).double()
    model.init_weights()
    return model.eval()


# ----------------------------------------------------------------------------- parity, loading


def test_timm_checkpoint_loads_and_gives_timm_outputs_in_float64(tmp_path):
    from timm.models.mlp_mixer import MlpMixer

    ref = MlpMixer(
        num_classes=5,
        img_size=IMG,
        patch_size=8,
        num_blocks=3,
        embed_dim=24,
        mlp_ratio=(10 / 24, 56 / 24),
    )
    ref = randomize_(ref).double().eval()
    ours = pretrained(tmp_path, ref.state_dict(), **PUBLISHED)
    x = image()
    with torch.no_grad():
        out = ours(x)[0].flatten(2).transpose(1, 2)
        assert max_relative(out, ref.forward_features(x)) < 1e-10
        logits = ref.head(out.mean(1))  # mmpretrain's GlobalAveragePooling + the same head
        assert max_relative(logits, ref(x)) < 1e-10


def test_mmpretrain_classifier_checkpoint_loads_and_gives_its_outputs_in_float64(tmp_path):
    from mmpretrain.models.backbones import MlpMixer

    ln = dict(type='LN')  # mmcv's, eps 1e-5
    ref = MlpMixer(arch={k: TINY[k] for k in TINY if k != 'patch_size'}, img_size=IMG, patch_size=8)
    randomize_(ref).double().eval()  # mmpretrain's train() returns None
    classifier = {'backbone.' + k: v for k, v in ref.state_dict().items()}
    classifier['head.fc.weight'] = torch.zeros(5, 24)
    ours = pretrained(
        tmp_path, {'state_dict': classifier}, norm_cfg=ln, out_norm_cfg=ln, **PUBLISHED
    )
    x = image()
    with torch.no_grad():
        assert max_relative(ours(x)[0].flatten(2), ref(x)[0]) < 1e-10


def test_own_checkpoints_load_folded_and_unfolded(tmp_path):
    model = tiny(idle_ratio=0.7)
    x = image()
    with torch.no_grad():
        ref = model(x)[0]
        unfolded = pretrained(tmp_path, model.state_dict(), idle_ratio=0.7)
        assert max_relative(unfolded(x)[0], ref) < 1e-12
        folded = pretrained(
            tmp_path, reparameterize(model).state_dict(), idle_ratio=0.7, deploy=True
        )
        assert max_relative(folded(x)[0], ref) < 1e-10
    with pytest.raises(ValueError, match='deploy=True'):
        pretrained(tmp_path, model.state_dict(), idle_ratio=0.7)


def test_checkpoints_of_another_family_or_size_are_refused_in_one_line(tmp_path):
    with pytest.raises(CheckpointError, match='not an MLP-Mixer checkpoint') as err:
        pretrained(tmp_path, RePaSwin(TINY_ARCH).state_dict())
    assert '\n' not in str(err.value)
    wider = MLPMixer(dict(TINY, embed_dims=32), img_size=IMG)
    with pytest.raises(CheckpointError, match='shape') as err:
        pretrained(tmp_path, wider.state_dict())
    assert '\n' not in str(err.value)
    # published (LayerNorm) weights leave a RePa model's BatchNorm statistics unset: refused
    with pytest.raises(KeyError, match='running_mean'):
        pretrained(tmp_path, MLPMixer(TINY, img_size=IMG, **PUBLISHED).state_dict())


# ----------------------------------------------------------------------------- folds


@pytest.mark.parametrize(
    'kw',
    [dict(idle_ratio=0.7), dict(idle_ratio=[0.0, 0.75, 1.0]), dict(idle_ratio=0.5, ffn_norm='LN')],
    ids=['bn', 'per_block', 'ln'],
)
def test_fold_is_exact_in_float64_and_deploy_builds_the_folded_form(kw):
    model = tiny(out_indices=(0, -1), **kw)
    x = image()
    with torch.no_grad():
        ref = model(x)
        reparameterize(model)
        assert max(max_relative(o, r) for o, r in zip(model(x), ref)) < 1e-10
    deployed = MLPMixer(TINY, img_size=IMG, out_indices=(0, 2), deploy=True, **kw).double()
    assert {k: v.shape for k, v in deployed.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }
    deployed.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert max_abs_diff(deployed.eval()(x), model(x)) == 0


def test_fold_is_close_in_float32():
    model = tiny(idle_ratio=0.7).float()
    x = image().float()
    with torch.no_grad():
        ref = model(x)[0]
        assert max_relative(reparameterize(model)(x)[0], ref) < 1e-5


def test_only_the_channel_mlps_fold_into_three_matrices():
    model = tiny(idle_ratio=0.75)
    tokens = copy.deepcopy([b.mlp_tokens.state_dict() for b in model.stages])
    reparameterize(model)
    for block, before in zip(model.stages, tokens):
        ffn = block.ffn
        assert isinstance(ffn, ChannelIdleFFN) and ffn.deploy and ffn.norm1 is None
        assert ffn.in_proj.weight.shape == (14 + 24, 24)  # ceil(56 / 4) active + the linear path
        assert ffn.out_proj.weight.shape == (24, 14)
        assert all(torch.equal(v, before[k]) for k, v in block.mlp_tokens.state_dict().items())


# ----------------------------------------------------------------------------- counts


def _params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize('arch, before, after', [('b16', 59.9, 24.4), ('l16', 208.4, 82.2)])
def test_classification_counts_match_repaformer_table_1(arch, before, after):
    """Backbone (the last output norm is the Mixer's final norm) + a 1000-way head, within
    the paper's rounding: b16 has 59.954 M unfolded, which the paper gives as 59.9."""
    with torch.device('meta'):  # shapes only
        unfolded, folded = MLPMixer(arch), MLPMixer(arch, deploy=True)
    head = 1000 * ARCH_SETTINGS[arch]['embed_dims'] + 1000
    assert abs((_params(unfolded) + head) / 1e6 - before) < 0.06
    assert abs((_params(folded) + head) / 1e6 - after) < 0.05


def test_published_b16_has_timm_s_parameters():
    from timm.models.mlp_mixer import MlpMixer

    with torch.device('meta'):
        ours, ref = MLPMixer('b16', **PUBLISHED), MlpMixer(num_blocks=12, embed_dim=768)
    assert _params(ours) + _params(ref.head) == _params(ref)


# ----------------------------------------------------------------------------- options


def test_outputs_out_indices_and_frozen_stages():
    model = MLPMixer(TINY, img_size=IMG, out_indices=(0, -1), frozen_stages=1)
    assert model.out_indices == (0, 2)
    outs = model(torch.randn(1, 3, *IMG))
    assert [tuple(o.shape) for o in outs] == [(1, 24, 5, 7)] * 2
    model.train()
    assert not any(p.requires_grad for p in model.stages[0].parameters())
    assert all(p.requires_grad for p in model.stages[1].parameters())


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(arch='b64'), r"unknown arch 'b64'; choose one of \['b16'"),
        (dict(arch=dict(embed_dims=8)), 'keys'),
        (dict(idle_ratio=1.5), r'idle_ratio must be in \[0, 1\]'),
        (dict(idle_ratio=[0.5, 0.5]), 'idle_ratio has 2 entries'),
        (dict(ffn_norm='GN'), 'ffn_norm'),
        (dict(img_size=4), 'img_size'),
        (dict(out_indices=(3,)), 'out_indices'),
    ],
)
def test_bad_options_say_what_is_wrong(kwargs, message):
    kwargs = {'arch': TINY, 'img_size': IMG, **kwargs}
    with pytest.raises(ConfigError, match=message):
        MLPMixer(**kwargs)


def test_other_input_sizes_are_refused():
    model = MLPMixer(TINY, img_size=IMG)
    with pytest.raises(InputError, match='5x7 patches of 40x56 images'):
        model(torch.randn(1, 3, 48, 56))
