"""The depth re-parameterized ViT's MAE route (the paper's D-MAE, §4): the attention
distillation loss against the formula written out per head and per branch in float64, the teacher
seeing the student's visible tokens, one training step of the pre-training config through
mmengine's Runner, and the fine-tuning config's model (global average pooling, λ = 1) folding
exactly, from the pre-trained encoder's checkpoint."""

import copy
import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import Runner
from mmpretrain.models import MAEViT
from mmpretrain.models.utils import MultiheadAttention

import mmrepa
from mmrepa.apis import build_model
from mmrepa.backbones.depth_rep_vit import JoinedAttention
from mmrepa.errors import CheckpointError, ConfigError
from mmrepa.selfsup import attention_distill_loss, vit_attention_maps
from tests.helpers import CLASSES, ROOT, max_relative, write_images

F64 = torch.float64
CONFIGS = osp.join(ROOT, 'configs', 'depth_rep_vit')
PRETRAIN = osp.join(CONFIGS, 'dmae_depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py')
FINETUNE = osp.join(CONFIGS, 'dmae_depthrep_vit_tiny_d6_8xb128_finetune_in1k.py')
STUDENT = dict(embed_dims=16, num_layers=4, num_heads=2)  # 2 blocks of 2 branches at depth=2
TEACHER = dict(embed_dims=24, num_layers=3, num_heads=2, feedforward_channels=48)


@pytest.fixture(autouse=True, scope='module')
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_teacher(path, img_size=32, patch_size=8, seed=0):
    """A small MAE ViT saved as mmpretrain's MAE saves it (``backbone.`` inside a model)."""
    torch.manual_seed(seed)
    teacher = MAEViT(arch=TEACHER, img_size=img_size, patch_size=patch_size)
    teacher.init_weights()
    with torch.no_grad():  # biases too, so that no term of the maps is zero
        for name, p in teacher.named_parameters():
            if name.endswith('bias'):
                p.normal_(0, 0.3)
    state = {f'backbone.{k}': v for k, v in teacher.state_dict().items()}
    torch.save({'state_dict': state}, path)
    return path


def tiny_mae_cfg(teacher_path, **backbone):
    """The D-MAE-6-R pre-training config's model, small (32 px images, patches of 8)."""
    cfg = Config.fromfile(PRETRAIN)
    cfg.model.backbone.update(arch=STUDENT, depth=2, img_size=32, patch_size=8, **backbone)
    cfg.model.neck.update(num_patches=16, patch_size=8, embed_dim=16, decoder_embed_dim=16)
    cfg.model.neck.decoder_num_heads = 2
    cfg.model.head.patch_size = 8
    cfg.model.teacher = dict(type='MAEViT', arch=TEACHER, img_size=32, patch_size=8)
    cfg.model.teacher_checkpoint = teacher_path
    return cfg


def build(cfg):
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        return build_model(cfg)


def randomized(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            is_scale = 'norm' in name and name.endswith('weight')
            p.copy_(1 + 0.3 * noise if is_scale else 0.3 * noise)
    return model


# ----------------------------------------------------------------------------- the formula


def naive_student_maps(attn, u, lam):
    """Branch b's softmax input per head, as the paper's §3.3 writes it (logit join; mmrepa's
    qkv join joins q and k), one head and one branch at a time: (B, H, n, N, N)."""
    B, N, d = u.shape
    n, H = attn.num_branches, attn.num_heads
    dh = d // H
    states = attn.branch_state_dicts()
    out = torch.zeros(B, H, n, N, N, dtype=F64)
    for h in range(H):
        qs, ks = [], []
        for s in states:
            w, bias = s['qkv.weight'], s['qkv.bias']
            rows = slice(h * dh, (h + 1) * dh)
            qs.append(u @ w[rows].T + bias[rows])
            rows = slice(d + h * dh, d + (h + 1) * dh)
            ks.append(u @ w[rows].T + bias[rows])
        for b in range(n):
            if attn.join == 'logits':
                logits = [qs[c] @ ks[c].transpose(-1, -2) for c in range(n)]
                mixed = logits[b] + lam * sum(logits[c] for c in range(n) if c != b)
                mixed = mixed / (math.sqrt(1 + (n - 1) * lam**2) * math.sqrt(dh))
            else:
                q = qs[b] + lam * sum(qs[c] for c in range(n) if c != b)
                k = ks[b] + lam * sum(ks[c] for c in range(n) if c != b)
                mixed = q @ k.transpose(-1, -2) / ((1 + (n - 1) * lam**2) * math.sqrt(dh))
            out[:, h, b] = torch.softmax(mixed, dim=-1)
    return out


def naive_teacher_maps(attn, u):
    """softmax(Q_h K_hᵀ / √d_h) of an mmpretrain attention, one head at a time."""
    B, N, d = u.shape
    H = attn.num_heads
    dh = d // H
    w, bias = attn.qkv.weight, attn.qkv.bias
    out = torch.zeros(B, H, N, N, dtype=F64)
    for h in range(H):
        q = u @ w[h * dh : (h + 1) * dh].T + bias[h * dh : (h + 1) * dh]
        k = u @ w[d + h * dh : d + (h + 1) * dh].T + bias[d + h * dh : d + (h + 1) * dh]
        out[:, h] = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1)
    return out


def naive_loss(student, teacher):
    """Σ over batch, head, query, key of (teacher − mean over branches of student)² / count."""
    B, H, n, N, _ = student.shape
    total = 0.0
    for i in range(B):
        for h in range(H):
            for r in range(N):
                for c in range(N):
                    mean = sum(student[i, h, b, r, c].item() for b in range(n)) / n
                    total += (teacher[i, h, r, c].item() - mean) ** 2
    return total / (B * H * N * N)


@pytest.mark.parametrize('join', ['logits', 'qkv'])
@pytest.mark.parametrize('n, lam', [(1, 0.0), (2, 0.0), (2, 0.37), (3, 0.8), (4, 1.0)])
def test_distill_loss_equals_the_written_out_formula(join, n, lam):
    torch.manual_seed(n)
    student = randomized(JoinedAttention(12, 3, n, join).to(F64))
    student.set_join_lambda(lam)
    teacher = randomized(MultiheadAttention(12, 3).to(F64), seed=1)
    u = torch.randn(2, 5, 12, dtype=F64)
    maps = student.attention_maps(u)
    reference = naive_student_maps(student, u, lam)
    # probabilities ≤ 1 from 4-term dot products (logits ≲ 10) and a 5-key softmax: ≲ 10·4·u64
    # ≈ 4e-15 a logit, ≲ 1e-14 an entry (u64 = 2^-53 ≈ 1.1e-16); observed 4e-16
    assert torch.allclose(maps, reference, rtol=0, atol=1e-13)
    target = vit_attention_maps(teacher, u)
    assert torch.allclose(target, naive_teacher_maps(teacher, u), rtol=0, atol=1e-13)
    loss = attention_distill_loss(maps, target).item()
    # a mean of 150 squares (γ_150 ≈ 1.7e-14) of differences ~0.1 carrying the maps' ≲ 1e-14:
    # relative ≲ 2e-13; observed 3e-16
    assert loss == pytest.approx(naive_loss(reference, target), rel=1e-12)
    assert loss > 1e-4  # not trivially zero


def test_folded_attention_gives_the_joined_maps():
    attn = randomized(JoinedAttention(12, 3, 2, 'logits').to(F64)).eval()
    attn.set_join_lambda(1.0)
    u = torch.randn(2, 5, 12, dtype=F64)
    joined = attn.attention_maps(u)
    attn.reparameterize()
    assert torch.allclose(attn.attention_maps(u)[:, :, 0], joined.mean(2), rtol=0, atol=1e-13)


def test_the_teacher_sees_the_students_visible_tokens(tmp_path):
    """loss_distill of DistilledMAE equals the formula on the maps of two separate forwards
    drawing the same mask: the student's encoder and mmpretrain's own MAEViT (the teacher)."""
    cfg = tiny_mae_cfg(save_teacher(str(tmp_path / 't.pth')), join_lambda=0.6)
    model = randomized(build(cfg).to(F64))
    model.teacher.to(F64)
    x = torch.randn(3, 3, 32, 32, dtype=F64)
    torch.manual_seed(7)
    loss = model.loss(x, [])['loss_distill'].item()

    seen = {}
    student_attn = model.backbone.stages[-1].attn
    teacher_attn = model.teacher.layers[-1].attn
    hooks = [
        student_attn.register_forward_pre_hook(lambda m, a: seen.setdefault('s', a[0])),
        teacher_attn.register_forward_pre_hook(lambda m, a: seen.setdefault('t', a[0])),
    ]
    with torch.no_grad():
        torch.manual_seed(7)
        model.backbone(x)
        torch.manual_seed(7)
        model.teacher(x)  # MAEViT.forward: its own masking, the same draw
    for h in hooks:
        h.remove()
    student = naive_student_maps(student_attn, seen['s'], student_attn.current_join_lambda)
    teacher = naive_teacher_maps(teacher_attn, seen['t'])
    assert student.shape[-1] == 1 + 4  # the class token and a quarter of 16 patches
    assert loss == pytest.approx(naive_loss(student, teacher), rel=1e-12)


def test_the_teacher_is_frozen_and_outside_the_state_dict(tmp_path):
    model = build(tiny_mae_cfg(save_teacher(str(tmp_path / 't.pth'))))
    model.train()
    assert not model.teacher.training
    assert all(not p.requires_grad for p in model.teacher.parameters())
    assert not any(k.startswith('teacher') for k in model.state_dict())
    names = {id(p) for p in model.parameters()}
    assert not any(id(p) in names for p in model.teacher.parameters())
    reference = torch.load(str(tmp_path / 't.pth'))['state_dict']
    for k, v in model.teacher.state_dict().items():
        assert torch.equal(v, reference[f'backbone.{k}']), k
    model.double()
    assert model.teacher.pos_embed.dtype == F64


def test_a_missing_or_mismatched_teacher_is_refused_in_one_line(tmp_path):
    with pytest.raises(CheckpointError, match='teacher checkpoint .*nope.pth not found'):
        build(tiny_mae_cfg(str(tmp_path / 'nope.pth')))
    with pytest.raises(ConfigError, match='needs teacher_checkpoint'):
        build(tiny_mae_cfg(None))
    cfg = tiny_mae_cfg(save_teacher(str(tmp_path / 't.pth')))
    cfg.model.backbone.arch = dict(STUDENT, num_heads=4)
    with pytest.raises(ConfigError, match='teacher layer 2 has 2 heads, student block 1 4'):
        build(cfg)
    # a teacher file of another size: the message speaks of the teacher, not a backbone arch
    other = save_teacher(str(tmp_path / 'big.pth'), img_size=64)
    with pytest.raises(CheckpointError, match=r'teacher checkpoint .*big.pth does not fit') as err:
        build(tiny_mae_cfg(other))
    assert "model.teacher's" in str(err.value) and 'idle_ratio' not in str(err.value)


# ----------------------------------------------------------------------------- the Runner


def test_one_training_step_through_the_runner(tmp_path):
    data = write_images(str(tmp_path / 'data'))
    cfg = tiny_mae_cfg(save_teacher(str(tmp_path / 't.pth')))
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=32),
        dict(type='PackInputs'),
    ]
    cfg.train_dataloader = dict(
        batch_size=4,
        num_workers=0,
        sampler=dict(type='InfiniteSampler', shuffle=True),
        collate_fn=dict(type='default_collate'),
        dataset=dict(type='CustomDataset', data_root=data, data_prefix='train', pipeline=pipeline),
    )
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1)
    cfg.param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=1)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    runner.train()
    scalars = runner.message_hub.log_scalars
    distill = scalars['train/loss_distill'].current()
    mae = scalars['train/loss_mae'].current()
    assert math.isfinite(distill) and distill > 0 and math.isfinite(mae)
    assert scalars['train/loss'].current() == pytest.approx(distill + mae, rel=1e-6)
    saved = torch.load(osp.join(cfg.work_dir, 'iter_1.pth'), weights_only=False)['state_dict']
    assert not any('teacher' in k for k in saved)  # 86 M parameters of MAE-Base stay out


# ----------------------------------------------------------------------------- fine-tuning


def tiny_finetune(checkpoint=None):
    cfg = Config.fromfile(FINETUNE)
    cfg.model.backbone.update(arch=STUDENT, depth=2, img_size=32, patch_size=8)
    if checkpoint is None:
        cfg.model.backbone.init_cfg = None
    else:
        cfg.model.backbone.init_cfg.update(checkpoint=checkpoint, num_heads=STUDENT['num_heads'])
    cfg.model.head.update(in_channels=STUDENT['embed_dims'], num_classes=CLASSES)
    return build(cfg)


def test_finetuning_pools_and_folds_exactly():
    """The fine-tuning config's model: global average pooling (no class token read), λ = 1 from
    the config, and the fold of the trained (random, float64) model equal to 1e-10."""
    model = tiny_finetune()
    assert model.backbone.out_type == 'avg'
    assert all(b.current_join_lambda == 1.0 for b in model.backbone.stages)
    model = randomized(model.to(F64)).eval()
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    with torch.no_grad():
        feats = model.backbone(x)[0]
        patches = model.backbone
        tokens, _ = patches._embed(x)
        for block in patches.stages:
            tokens = block(tokens, None)
        gap = patches.norm1(tokens[:, 1:].mean(1))  # the mean of the patch tokens, then LN
        # the backbone's own operations (observed 0); a reordered 16-token mean would err by
        # γ_16 ≈ 1.8e-15, × the LayerNorm's 1/σ ≲ 10
        assert max_relative(feats, gap) <= 1e-12
        joined = model(x, mode='tensor')
        mmrepa.reparameterize(model)
        folded = model(x, mode='tensor')
    assert all(b.deploy for b in model.backbone.stages)
    # u64 × ≤ 10^3-term reductions ≈ 1e-13 a layer, × ~10^2 layers ≈ 1e-10; observed 0
    assert max_relative(folded, joined) <= 1e-10


def test_the_pretrained_encoder_initializes_the_finetuning_model(tmp_path):
    mae = build(tiny_mae_cfg(save_teacher(str(tmp_path / 't.pth'))))
    mae.init_weights()
    for block in mae.backbone.stages:
        block.set_join_lambda(1.0)  # as the joining run leaves it
    path = str(tmp_path / 'mae.pth')
    torch.save({'state_dict': copy.deepcopy(mae.state_dict())}, path)
    model = tiny_finetune(path)
    model.init_weights()
    theirs = mae.backbone.state_dict()
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, theirs[k]), k
