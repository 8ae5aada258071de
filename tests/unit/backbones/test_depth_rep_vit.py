"""DepthRepViT (the depth re-parameterization paper): whole-model sizes against the table of
docs/backbones/depth_rep_vit.md#sizes, the exact fold of the backbone
(classification and dense outputs, windows with padding), parity with mmpretrain's and timm's
ViT at one branch, checkpoint conversion and its head-count check, the diversity loss, and the
options users know from mmpretrain and mmdet."""

import copy
import functools

import pytest
import torch
from mmengine.config import Config

import mmrepa  # noqa: F401  (registers the backbone)
from mmrepa.backbones import DepthRepViT
from mmrepa.errors import CheckpointError, ConfigError
from mmrepa.fold import FoldError
from mmrepa.utils.complexity import complexity
from tests.helpers import (
    max_relative,
    reference_block,
)

# Tolerances. Float64 comparisons of a fold (or a written-out reference) with the model: 1e-12
# for one layer, 1e-10 through a block or a model, absolute on values of order 1-10 or relative
# to the largest output. The bound is u64 = 2^-53 ≈ 1.1e-16 times a size factor: a reduction
# of n ≤ ~10^3 terms errs by at most γ_n ≈ n·u64 of the sum of their magnitudes (≲ 10), about
# 1e-12 a layer, and a model adds at most ~10^2 of those; observed errors stay near 1e-13.
# A missing fold term or a wrong BatchNorm statistic moves outputs by 1e-3 or more.
# Float32 folded model against the float64 formula at 1e-5 ≈ 168·u32 of the output's scale
# (u32 times a size factor of the reductions through the model; observed ≤ 0.11 of it on both
# kernel settings); mmpretrain's float32 position-embedding interpolation at 1e-6 ≈ 17·u32
# (bicubic: 16-term sums; observed ≤ 0.02 of it).

F64 = torch.float64
JOINS = ('logits', 'qkv')
# 2 original layers, 4 heads of 6: small, still multi-head and multi-block at n = 1
SMALL = dict(embed_dims=24, num_layers=4, num_heads=4)
DEEPER = dict(SMALL, num_layers=8)  # two blocks or more for every n tested


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def randomized(model, seed=0):
    """Every parameter random (LN affine and all biases included), float64, eval mode."""
    g = torch.Generator().manual_seed(seed)
    model = model.to(F64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=F64)
            is_scale = 'norm' in name and name.endswith('weight')
            p.copy_(1 + 0.3 * noise if is_scale else 0.3 * noise)
    model.eval()  # mmpretrain's backbones do not return self from train()
    return model


def joined(model):
    for block in model.stages:
        block.set_join_lambda(1.0)
    return model


# ------------------------------------------------------------- sizes (depth_rep_vit.md#sizes)

HEAD_PARAMS, HEAD_MACS = 193_000, 192_000  # the 1000-class head the sizes include


def spec_block_macs(n_attn_width, ffn_copies, N=197, d=192):
    """Per-block "full" MACs (docs/backbones/depth_rep_vit.md#sizes): attention of width w,
    ``ffn_copies`` FFNs of 4d."""
    w = n_attn_width
    return N * d * 3 * w + N * w * d + 8 * N * d * d * ffn_copies + 10 * N * d + 2 * N * N * w


@pytest.mark.parametrize(
    'n, train, logits, qkv',
    [
        (1, 5_717_416, 5_717_416, 5_717_416),
        (2, 5_712_808, 3_936_424, 3_048_232),
        (3, 5_711_272, 3_342_760, 2_158_504),
        (4, 5_710_504, 3_045_928, 1_713_640),
    ],
)
def test_vit_tiny_sizes_equal_spec_before_and_after_folding(n, train, logits, qkv):
    """ViT-Tiny (12 heads) at 224²: parameters exactly the table of
    docs/backbones/depth_rep_vit.md#sizes (with its head), MACs exactly the formula above
    ("full": attention matmuls included), and 12 / n blocks left."""
    x = torch.randn(1, 3, 224, 224)
    depth, d = 12 // n, 192
    fixed = 196 * 768 * 192 + 5 * 192  # patch embedding + fc_norm
    for join, folded_params, width in (('logits', logits, n * d), ('qkv', qkv, d)):
        model = DepthRepViT('tiny', num_branches=n, join=join).eval()
        before = complexity(model, (x,))
        assert before['params'] + HEAD_PARAMS == train
        assert before['macs'] == fixed + depth * spec_block_macs(n * d, n)
        joined(model).reparameterize()
        after = complexity(model, (x,))
        assert after['params'] + HEAD_PARAMS == folded_params
        assert after['macs'] == fixed + depth * spec_block_macs(width, 1)
        assert len(model.stages) == depth
        assert not any('branch' in k for k in model.state_dict())


def test_whole_model_macs_round_to_the_spec_table():
    """The formula above, with the head, gives the MACs of docs/backbones/depth_rep_vit.md#sizes
    (in millions)."""
    fixed = 196 * 768 * 192 + 5 * 192 + HEAD_MACS
    assert round((fixed + 12 * spec_block_macs(192, 1)) / 1e6, 1) == 1258.2
    for n, train, logits, qkv in (
        (2, 1256.0, 907.4, 643.7),
        (3, 1255.2, 790.4, 438.8),
        (4, 1254.8, 731.9, 336.4),
    ):
        depth = 12 // n
        assert round((fixed + depth * spec_block_macs(n * 192, n)) / 1e6, 1) == train
        assert round((fixed + depth * spec_block_macs(n * 192, 1)) / 1e6, 1) == logits
        assert round((fixed + depth * spec_block_macs(192, 1)) / 1e6, 1) == qkv


def test_depth_or_num_branches():
    assert DepthRepViT(SMALL, depth=2).num_branches == 2
    assert DepthRepViT(SMALL, num_branches=4).depth == 1
    with pytest.raises(ConfigError, match=r'depth=3 .* choose one of \[1, 2, 4\]'):
        DepthRepViT(SMALL, depth=3)
    with pytest.raises(ConfigError, match=r'num_branches=3 .* choose one of \[1, 2, 4\]'):
        DepthRepViT(SMALL, num_branches=3)
    with pytest.raises(ConfigError, match='contradicts depth'):
        DepthRepViT(SMALL, num_branches=2, depth=4)
    with pytest.raises(ConfigError, match='num_branches .* or depth'):
        DepthRepViT(SMALL)


# ----------------------------------------------------------------------- the fold


DENSE = dict(
    with_cls_token=False,
    out_type='featmap',
    window_size=3,
    global_blocks=(1,),
    out_indices=(0, 1),
    img_size=64,
)


def joined_formula(model):
    """A copy of the joined model (λ = 1) whose blocks compute the paper's per-branch formulas
    (``tests.helpers.reference_block``: each branch's own qkv, proj, fc1 and fc2,
    explicit N x N logits per branch, windows cut at the map's edge without padding). It never
    runs the fold's arithmetic, which the layers' own forward at λ = 1 shares with the fold:
    a fold that is wrong in both (a wrong 1/n on q) cannot pass a comparison with it."""
    reference = copy.deepcopy(model)
    for block in reference.stages:
        block.forward = functools.partial(_block_by_formula, block)
    return reference


def _block_by_formula(block, x, hw_shape=None):
    return reference_block(block, x, hw=hw_shape)


@pytest.mark.parametrize('join', JOINS)
@pytest.mark.parametrize('n', [2, 4])
@pytest.mark.parametrize(
    'kind, size',
    [('avg', (64, 64)), ('cls', (48, 80)), ('featmap', (200, 328)), ('featmap', (81, 47))],
)
def test_fold_equals_the_joined_formula(join, n, kind, size):
    """float64, every parameter random: the folded backbone (n times shallower) equals the
    joined one computed branch by branch to 1e-10 relative, for pooled outputs and for dense
    maps whose token grid (13x21, 6x3) is not a multiple of the window (padding masked), with
    windowed and global blocks."""
    options = DENSE if kind == 'featmap' else dict(out_type=kind, img_size=64)
    model = joined(randomized(DepthRepViT(DEEPER, num_branches=n, join=join, **options)))
    x = torch.randn(2, 3, *size, dtype=F64)
    with torch.no_grad():
        ref = joined_formula(model)(x)
        assert max_relative(model(x), ref) <= 1e-10  # the λ = 1 training forward
        model.reparameterize()
        assert len(model.stages) == DEEPER['num_layers'] // n
        out = model(x)
    assert max_relative(out, ref) <= 1e-10
    if kind == 'featmap':
        assert [o.shape for o in out] == [(2, 24, -(-size[0] // 16), -(-size[1] // 16))] * 2


@pytest.mark.parametrize('join', JOINS)
def test_float32_fold_is_close(join):
    """The float32 model folded against the joined formula in float64 (same weights)."""
    model = joined(randomized(DepthRepViT(SMALL, num_branches=2, join=join, **DENSE)))
    x = torch.randn(1, 3, 200, 328, dtype=F64)
    with torch.no_grad():
        ref = joined_formula(model)(x)
        model.float().reparameterize()
        assert model.stages[0].attn.qkv.weight.dtype == torch.float32
        assert max_relative(model(x.float()), ref) <= 1e-5


@pytest.mark.parametrize('lam', [0.0, 0.5, 0.99])
def test_fold_refuses_below_one_naming_the_block(lam):
    model = randomized(DepthRepViT(SMALL, num_branches=2, join_lambda=lam))
    with pytest.raises(FoldError, match=rf'stages\.0.*join_lambda = {lam}'):
        model.reparameterize()
    assert 'branch_qkv.weight' in dict(model.stages[0].attn.named_parameters())


@pytest.mark.parametrize('join', JOINS)
def test_deploy_builds_the_folded_model(join):
    """``deploy=True`` has the folded keys and shapes; the folded state dict loads strictly
    and gives the same outputs; folding twice changes nothing."""
    model = joined(randomized(DepthRepViT(SMALL, num_branches=2, join=join, img_size=64)))
    model.reparameterize()
    state = copy.deepcopy(model.state_dict())
    model.reparameterize()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    deployed = DepthRepViT(SMALL, num_branches=2, join=join, img_size=64, deploy=True)
    assert {k: v.shape for k, v in deployed.state_dict().items()} == {
        k: v.shape for k, v in state.items()
    }
    deployed.to(F64).load_state_dict(state, strict=True)
    x = torch.randn(1, 3, 64, 64, dtype=F64)
    with torch.no_grad():
        assert torch.equal(deployed.eval()(x)[0], model(x)[0])


# ----------------------------------------------------------------------- parity, checkpoints


def mmpretrain_vit(out_type, heads=4, layers=4, final_norm=None):
    from mmpretrain.models import VisionTransformer

    arch = dict(embed_dims=24, num_layers=layers, num_heads=heads, feedforward_channels=96)
    return VisionTransformer(
        arch=arch,
        img_size=64,
        patch_size=16,
        out_type=out_type,
        final_norm=out_type == 'cls_token' if final_norm is None else final_norm,
    )


def save(tmp_path, state_dict, cfg_backbone=None, name='ckpt.pth'):
    """A checkpoint as mmengine's Runner writes it (config text in ``meta.cfg``)."""
    ckpt = dict(state_dict=state_dict)
    if cfg_backbone is not None:
        ckpt['meta'] = dict(cfg=Config(dict(model=dict(backbone=cfg_backbone))).pretty_text)
    path = tmp_path / name
    torch.save(ckpt, path)
    return str(path)


@pytest.mark.parametrize('out_type, theirs', [('avg', 'avg_featmap'), ('cls', 'cls_token')])
def test_single_branch_equals_mmpretrain_vit(tmp_path, out_type, theirs):
    """n = 1 from an mmpretrain ViT checkpoint (as a classifier saves it) equals mmpretrain's
    ``VisionTransformer`` in float64, at the pretraining size and at another one (position
    embedding interpolated the same way, bicubic)."""
    ref = randomized(mmpretrain_vit(theirs))
    state = {f'backbone.{k}': v for k, v in ref.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(10, 24, dtype=F64)
    backbone_cfg = dict(
        type='VisionTransformer',
        arch=dict(embed_dims=24, num_layers=4, num_heads=4, feedforward_channels=96),
    )
    path = save(tmp_path, state, backbone_cfg)
    model = DepthRepViT(
        SMALL,
        num_branches=1,
        img_size=64,
        out_type=out_type,
        init_cfg=dict(type='Pretrained', checkpoint=path),
    ).to(F64)
    model.init_weights()
    model.eval()
    # mmpretrain interpolates the position embedding in float32, mmrepa in the model's dtype
    for size, tol in (((64, 64), 1e-10), ((80, 112), 1e-6)):
        x = torch.randn(2, 3, *size, dtype=F64)
        with torch.no_grad():
            assert max_relative(model(x), ref(x)) <= tol


def test_single_branch_equals_timm_vit(tmp_path):
    timm = pytest.importorskip('timm')
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=64,
        patch_size=16,
        embed_dim=24,
        depth=4,
        num_heads=4,
        global_pool='avg',
        num_classes=0,
    )
    ref = randomized(ref)
    path = save(tmp_path, ref.state_dict())
    model = DepthRepViT(
        SMALL,
        num_branches=1,
        img_size=64,
        init_cfg=dict(type='Pretrained', checkpoint=path, num_heads=4),
    ).to(F64)
    model.init_weights()
    x = torch.randn(2, 3, 64, 64, dtype=F64)
    with torch.no_grad():
        assert max_relative(model.eval()(x), (ref(x),)) <= 1e-10


def test_a_deeper_vit_initializes_the_branches(tmp_path):
    """4 layers -> 2 blocks x 2 branches: layer k·n + b is block k's branch b, the shared
    norms are layer k·n's; the dense model drops the class token's position and resizes."""
    ref = randomized(mmpretrain_vit('avg_featmap'))
    path = save(
        tmp_path,
        ref.state_dict(),
        num_heads_cfg := dict(
            type='VisionTransformer',
            arch=dict(embed_dims=24, num_layers=4, num_heads=4, feedforward_channels=96),
        ),
    )
    assert num_heads_cfg['type'] == 'VisionTransformer'
    model = DepthRepViT(
        SMALL,
        num_branches=2,
        with_cls_token=False,
        out_type='featmap',
        img_size=96,
        init_cfg=dict(type='Pretrained', checkpoint=path),
    )
    model.to(F64).init_weights()
    for k in range(2):
        block = model.stages[k]
        for b, branch in enumerate(block.attn.branch_state_dicts()):
            layer = ref.layers[2 * k + b]
            assert torch.equal(branch['qkv.weight'], layer.attn.qkv.weight)
            assert torch.equal(branch['proj.bias'], layer.attn.proj.bias)
        for b, branch in enumerate(block.mlp.branch_state_dicts()):
            assert torch.equal(branch['fc1.weight'], ref.layers[2 * k + b].ffn.layers[0][0].weight)
        assert torch.equal(block.norm1.weight, ref.layers[2 * k].ln1.weight)
    assert model.pos_embed.shape == (1, 36, 24)  # 4x4 + class token -> 6x6


def test_head_count_is_checked(tmp_path):
    """A 3-head checkpoint has the shapes of a 12-head one: refused, naming both counts; a
    checkpoint that does not say is refused until init_cfg states num_heads."""
    ref = mmpretrain_vit('avg_featmap', heads=3)
    cfg = dict(type='VisionTransformer', arch='deit-tiny')  # mmpretrain's 3-head ViT-Tiny
    path = save(tmp_path, ref.state_dict(), cfg)
    model = DepthRepViT(
        SMALL, num_branches=1, img_size=64, init_cfg=dict(type='Pretrained', checkpoint=path)
    )
    with pytest.raises(CheckpointError, match='3 attention heads .* 4'):
        model.init_weights()
    bare = save(tmp_path, ref.state_dict(), name='bare.pth')
    model = DepthRepViT(
        SMALL, num_branches=1, img_size=64, init_cfg=dict(type='Pretrained', checkpoint=bare)
    )
    with pytest.raises(CheckpointError, match='num_heads=H'):
        model.init_weights()
    model.init_cfg['num_heads'] = 4
    model.init_weights()


def test_a_checkpoint_of_another_depth_is_refused(tmp_path):
    path = save(tmp_path, mmpretrain_vit('avg_featmap', layers=2).state_dict())
    model = DepthRepViT(
        SMALL,
        num_branches=1,
        img_size=64,
        init_cfg=dict(type='Pretrained', checkpoint=path, num_heads=4),
    )
    with pytest.raises(CheckpointError, match='2 transformer layers.* needs 4'):
        model.init_weights()


# ----------------------------------------------------------------------- diversity loss


def test_diversity_loss_is_the_mean_pairwise_cosine_squared():
    """Tracking the branch outputs changes neither the output nor its gradients; the loss is
    α · the mean over sub-layers of mean_{b<c} cos²(f_b, f_c), here checked on the first
    block's branches run one by one."""
    torch.manual_seed(0)
    plain = randomized(DepthRepViT(SMALL, num_branches=2, img_size=64, join_lambda=0.0))
    tracked = copy.deepcopy(plain)
    tracked.diversity_loss_weight = 0.05
    for m in tracked.modules():
        if hasattr(m, 'track_branch_diversity'):
            m.track_branch_diversity = True
    plain.train(), tracked.train()
    x = torch.randn(2, 3, 64, 64, dtype=F64)
    out_p, out_t = plain(x)[0], tracked(x)[0]
    assert (out_p - out_t).abs().max() <= 1e-12
    loss = tracked.pop_diversity_loss()
    assert tracked.pop_diversity_loss() is None

    # first block, attention: each branch as its own attention on the shared LN1
    attn = tracked.stages[0].attn
    tokens, _ = tracked.patch_embed(x)
    tokens = torch.cat([tracked.cls_token.expand(2, -1, -1), tokens], 1) + tracked.pos_embed
    u = tracked.stages[0].norm1(tokens)
    single = []
    for branch in attn.branch_state_dicts():
        one = type(attn)(24, 4, 1, join='logits').to(F64)
        one.load_state_dict(
            {
                'branch_qkv.weight': branch['qkv.weight'],
                'branch_qkv.bias': branch['qkv.bias'],
                'branch_proj.weight': branch['proj.weight'],
                'branch_proj.bias': branch['proj.bias'][None],
                'join_lambda': torch.tensor(0.0),
            }
        )
        single.append(one(u))
    cos = torch.nn.functional.cosine_similarity(single[0], single[1], dim=-1)
    attn(u)
    assert torch.allclose(attn.branch_diversity, cos.square().mean(), atol=1e-12)
    assert loss.requires_grad and 0 < loss.item() < 0.05

    out_p.sum().backward()
    grads_p = [p.grad for p in plain.parameters()]
    out_t.sum().backward()
    for g_p, p in zip(grads_p, tracked.parameters()):
        assert torch.allclose(g_p, p.grad, atol=1e-10)


def test_an_uncollected_diversity_loss_is_an_error():
    model = DepthRepViT(SMALL, num_branches=2, img_size=64, diversity_loss_weight=0.05).train()
    x = torch.randn(1, 3, 64, 64)
    model(x)
    with pytest.raises(ConfigError, match='DiversityImageClassifier'):
        model(x)
    with pytest.raises(ValueError, match='classification regularizer'):
        DepthRepViT(SMALL, num_branches=2, diversity_loss_weight=0.05, **DENSE)


# ----------------------------------------------------------------------- options


def test_frozen_stages_and_layer_depths():
    model = DepthRepViT(SMALL, num_branches=2, frozen_stages=1, img_size=64)
    model.train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert {'cls_token', 'pos_embed', 'patch_embed.projection.weight'} <= frozen
    assert all(n in frozen for n, _ in model.named_parameters() if n.startswith('stages.0.'))
    assert not any(n.startswith('stages.1.') for n in frozen)
    assert not model.stages[0].training and model.stages[1].training
    depths = {n: model.get_layer_depth(n)[0] for n, _ in model.named_parameters()}
    assert depths['pos_embed'] == 0 and depths['norm1.weight'] == 3
    assert depths['stages.1.attn.branch_qkv.weight'] == depths['stages.1.norm2.bias'] == 2
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (3, 4)


@pytest.mark.parametrize('fold', [False, True])
def test_frozen_stages_zero_freezes_the_embeddings_only(fold):
    """frozen_stages=0: the patch embedding, the position embedding and the class token, in
    training mode and right after a fold (no train() or eval() in between)."""
    model = joined(DepthRepViT(SMALL, num_branches=2, frozen_stages=0, img_size=64)).train()
    if fold:
        model.switch_to_deploy()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        'cls_token',
        'pos_embed',
        'patch_embed.projection.weight',
        'patch_embed.projection.bias',
    }
    assert not model.patch_embed.training and model.stages[0].training


def test_layer_wise_lr_decay_in_mmpretrain():
    """mmpretrain's LearningRateDecayOptimWrapperConstructor gives every parameter of a
    block (all its branches) one learning rate, decaying towards the input."""
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS

    # whatever default scope an earlier test in this process left (mmdet's has no classifier)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        classifier = MODELS.build(
            dict(
                type='ImageClassifier',
                backbone=dict(type='DepthRepViT', arch=SMALL, num_branches=2, img_size=64),
                head=dict(type='LinearClsHead', num_classes=3, in_channels=24),
            )
        )
        constructor = OPTIM_WRAPPER_CONSTRUCTORS.build(
            dict(
                type='LearningRateDecayOptimWrapperConstructor',
                optim_wrapper_cfg=dict(
                    type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05)
                ),
                paramwise_cfg=dict(layer_decay_rate=0.5),
            )
        )
    groups = constructor(classifier).optimizer.param_groups
    lr = {}
    for group in groups:
        for p in group['params']:
            lr[id(p)] = group['lr']
    named = dict(classifier.named_parameters())
    assert (
        lr[id(named['backbone.stages.1.attn.branch_qkv.weight'])]
        == lr[id(named['backbone.stages.1.mlp.branch_fc2.bias'])]
        == 0.5
    )
    assert lr[id(named['backbone.stages.0.attn.branch_qkv.weight'])] == 0.25
    assert lr[id(named['backbone.pos_embed'])] == 0.125
    assert lr[id(named['head.fc.weight'])] == 1.0


def test_gradient_checkpointing_gives_the_same_gradients():
    model = randomized(DepthRepViT(SMALL, num_branches=2, img_size=64, join_lambda=0.3))
    cp = copy.deepcopy(model)
    cp.with_cp = True
    x = torch.randn(1, 3, 64, 64, dtype=F64)
    model.train()(x)[0].sum().backward()
    cp.train()(x)[0].sum().backward()
    for p, q in zip(model.parameters(), cp.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12)


def test_registered_for_every_task():
    from mmdet.registry import MODELS as DET
    from mmpretrain.registry import MODELS as CLS
    from mmseg.registry import MODELS as SEG

    for registry in (DET, SEG, CLS):
        model = registry.build(dict(type='DepthRepViT', arch=SMALL, depth=2, **DENSE))
        assert isinstance(model, DepthRepViT)


def test_bad_options_name_themselves():
    with pytest.raises(ValueError, match='with_cls_token=False'):
        DepthRepViT(SMALL, num_branches=2, window_size=7)
    with pytest.raises(ValueError, match='out_type'):
        DepthRepViT(SMALL, num_branches=2, out_type='tokens')
    with pytest.raises(ValueError, match=r'global_blocks \[5\]'):
        DepthRepViT(
            SMALL,
            num_branches=2,
            with_cls_token=False,
            window_size=3,
            out_type='featmap',
            global_blocks=(5,),
        )


def test_a_classifier_checkpoint_initializes_the_dense_backbone(tmp_path):
    """mmrepa's own classifier layout into a detection backbone: the class token and its
    position are dropped, the grid resized; the rest loads, the classifier's output norm into
    the same block's output norm."""
    classifier = randomized(DepthRepViT(SMALL, num_branches=2, img_size=64))
    path = save(
        tmp_path,
        {f'backbone.{k}': v for k, v in classifier.state_dict().items()},
        dict(type='DepthRepViT', arch=SMALL, num_branches=2),
    )
    dense = DepthRepViT(
        SMALL,
        num_branches=2,
        img_size=96,
        with_cls_token=False,
        out_type='featmap',
        window_size=3,
        init_cfg=dict(type='Pretrained', checkpoint=path),
    ).to(F64)
    report = dense.load_pretrained(path)
    assert report.missing == []
    assert report.unexpected == ['cls_token']
    assert torch.equal(
        dense.stages[1].attn.branch_qkv.weight, classifier.stages[1].attn.branch_qkv.weight
    )
    assert dense.pos_embed.shape == (1, 36, 24)
    # the class token's entry (the first) is dropped, the 4x4 grid resized to 6x6
    grid = classifier.pos_embed[:, 1:].reshape(1, 4, 4, 24).permute(0, 3, 1, 2)
    grid = torch.nn.functional.interpolate(grid, size=(6, 6), mode='bicubic', align_corners=False)
    assert torch.equal(dense.pos_embed, grid.flatten(2).transpose(1, 2))


@pytest.mark.parametrize('layout', ['mmrepa', 'timm'])
def test_a_class_token_checkpoint_drops_the_class_tokens_position(tmp_path, layout):
    """Loaded into a model without a class token, a checkpoint's position table loses its
    first entry (the class token's) and keeps the patches' entries as they are."""
    source = randomized(DepthRepViT(SMALL, num_branches=1, img_size=64))
    state = source.state_dict()
    if layout == 'timm':  # one branch folds into timm's block names
        folded = copy.deepcopy(source)
        folded.reparameterize()
        state = {
            k.replace('stages.', 'blocks.').replace(
                'patch_embed.projection.', 'patch_embed.proj.'
            ): v
            for k, v in folded.state_dict().items()
        }
    path = save(tmp_path, state)
    model = DepthRepViT(SMALL, num_branches=1, img_size=64, with_cls_token=False).to(F64)
    model.load_pretrained(path, num_heads=SMALL['num_heads'])
    assert torch.equal(model.pos_embed, source.pos_embed[:, 1:])
    assert torch.equal(model.patch_embed.projection.weight, source.patch_embed.projection.weight)
