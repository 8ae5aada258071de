"""Issue 39: one small test for each one-token library fault the rest of the suite let through.
Each test checks the library against an independently stated expectation (a number written
out, a file that must be refused, numpy's float64 product), never a function against itself."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

import mmrepa
from mmrepa.backbones import PoolFormer, PRepBNViT
from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.checkpoint.sharded import SHARD_META, rank_file
from mmrepa.config.checks import check_checkpoint_fit
from mmrepa.datasets.own_data.folder import _clip_topk
from mmrepa.datasets.token_label import read_label_map
from mmrepa.engine import ReparameterizeHook
from mmrepa.engine.hooks.scheduled_scalar_hook import iterations
from mmrepa.engine.strategies import _float32_affine_class
from mmrepa.errors import InputError
from tests.helpers import run_script_here

# ------------------------------------------------------------------ ReparameterizeHook._verify


class Tensors(nn.Module):
    """A model whose tensor-mode output is its input times ``factor``."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def data_preprocessor(self, batch, training):
        return dict(inputs=batch['inputs'], data_samples=None)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return inputs * self.factor


def test_verify_refuses_a_folded_model_that_returns_nan():
    hook = ReparameterizeHook()
    runner = SimpleNamespace(logger=logging.getLogger('test_injected_faults'))
    batch = dict(inputs=torch.ones(1, 4))
    hook._verify(runner, Tensors(1.0), Tensors(1.0), batch)  # the same outputs pass
    with pytest.raises(RuntimeError, match='disagrees with the original'):
        hook._verify(runner, Tensors(1.0), Tensors(float('nan')), batch)


# ------------------------------------------------------------------------ fold: all or nothing


class Interrupted(nn.Module):
    """A foreign layer whose ``switch_to_deploy`` changes its weight, then is interrupted."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def switch_to_deploy(self):
        with torch.no_grad():
            self.fc.weight.fill_(7.0)
        raise KeyboardInterrupt


def test_an_interrupted_fold_leaves_the_weights_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(Interrupted()).eval()
    before = model[0].fc.weight.detach().clone()
    assert not torch.equal(before, torch.full((3, 3), 7.0))
    with pytest.raises(KeyboardInterrupt):
        mmrepa.reparameterize(model)
    assert torch.equal(model[0].fc.weight, before)


# ----------------------------------------------------------------- Float32AffineBatchNorm


def test_low_precision_batchnorm_in_eval_counts_no_batches():
    bn = _float32_affine_class(nn.BatchNorm2d)(4).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        bn.running_var.copy_(torch.tensor([1.0, 4.0, 0.25, 2.0]))
    bn.weight.data, bn.bias.data = bn.weight.data.bfloat16(), bn.bias.data.bfloat16()
    x = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = bn(x.bfloat16())
    assert bn.num_batches_tracked.item() == 0
    assert torch.equal(bn.running_mean, torch.tensor([0.5, -1.0, 2.0, 0.0]))
    # eval normalizes with the running statistics (written out, weight 1 and bias 0)
    mean = torch.tensor([0.5, -1.0, 2.0, 0.0]).view(1, 4, 1, 1)
    var = torch.tensor([1.0, 4.0, 0.25, 2.0]).view(1, 4, 1, 1)
    ref = (x.bfloat16().double() - mean.double()) / (var.double() + bn.eps).sqrt()
    assert (out.double() - ref).abs().max().item() < 0.05  # bfloat16 output: 2^-8 relative


# ------------------------------------------------------------------------------- OpenVINO IR


def test_openvino_ir_keeps_float32_weights(tmp_path):
    ov = pytest.importorskip('openvino')
    from mmrepa.integrations.openvino import OpenVINOSession, read_model, save_ir

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)  # values fp16 would round by ~1e-3
    x = rng.standard_normal((2, 16)).astype(np.float32)
    param = ov.opset13.parameter([2, 16], ov.Type.f32, name='x')
    matmul = ov.opset13.matmul(param, ov.opset13.constant(w), False, False)
    save_ir(ov.Model([matmul], [param], 'matmul'), str(tmp_path / 'm.xml'))
    (out,) = OpenVINOSession(read_model(str(tmp_path / 'm.xml'))).run(None, {'x': x})
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(out - ref).max() < 1e-5


# ------------------------------------------------------------- tools/consolidate_checkpoint.py


def test_consolidate_refuses_out_inside_the_sharded_folder(tmp_path):
    folder = tmp_path / 'sharded'
    folder.mkdir()
    for rank in range(2):  # a valid pair of rank files: [0, 2) and [2, 4) of 4 values
        torch.save(
            dict(
                state_dict={'w': torch.arange(2.0) + 2 * rank},
                meta={
                    SHARD_META: dict(
                        world_size=2, rank=rank, params={'w': [[4], 2 * rank, 2 * rank + 2]}
                    )
                },
            ),
            rank_file(str(folder), rank),
        )
    _, log = run_script_here(
        'tools/consolidate_checkpoint.py', str(folder), str(folder / 'full.pth'), ok=False
    )
    assert 'inside SHARDED_DIR' in log.strip().splitlines()[-1]
    assert not (folder / 'full.pth').exists()


# ----------------------------------------------------------------- check_checkpoint_fit


POOLFORMER_TINY = dict(depths=(1, 1, 1, 1), dims=(8, 16, 16, 16))


def test_a_ddp_saved_checkpoint_fits(tmp_path):
    torch.manual_seed(0)
    saved = PoolFormer(POOLFORMER_TINY)
    path = tmp_path / 'ddp.pth'
    state = {f'module.backbone.{k}': v + 1 for k, v in saved.state_dict().items()}
    torch.save(dict(state_dict=state), path)
    backbone = PoolFormer(POOLFORMER_TINY)
    check_checkpoint_fit(backbone, str(path), 'load_from')  # raises for another model's
    weight = backbone.state_dict()['stages.0.blocks.0.layer_scale1.scale']  # loaded: 1e-5 + 1
    assert torch.allclose(weight, torch.full_like(weight, 1 + 1e-5))


# ------------------------------------------------------------------ PRepBNViT.filter_checkpoint


@pytest.mark.parametrize('conv_stem', [None, False, True])
def test_prepbn_vit_state_dict_passes_its_own_filter(conv_stem):
    model = PRepBNViT(
        dict(embed_dims=24, num_layers=2, num_heads=3, feedforward_channels=48),
        img_size=32,
        patch_size=8,
        conv_stem=conv_stem,
    )
    own = model.state_dict()
    # LV-ViT's convolutional stem (BatchNorms in patch_embed) only when asked for: a custom
    # arch takes the default arch's patchifying conv
    assert any(k.startswith('patch_embed.') and 'running_mean' in k for k in own) == bool(conv_stem)
    filtered = model.filter_checkpoint(dict(own))
    assert set(filtered) == set(own)


# --------------------------------------------------------------- ScheduledScalarHook


def test_a_ratio_of_the_iterations_is_rounded():
    assert iterations(None, 0.29, 100) == 29  # 0.29 * 100 is 28.999999999999996
    assert iterations(None, 0.35, 10) == 4  # 3.5, rounded to even
    assert iterations(7, None, 100) == 7


# --------------------------------------------------------------------- token-label maps


def test_a_token_label_class_index_equal_to_num_classes_is_refused(tmp_path):
    path = tmp_path / 'map.pt'
    scores, classes = torch.full((1, 2, 2), 0.5), torch.full((1, 2, 2), 4.0)
    torch.save(torch.stack([scores, classes]), path)
    read_label_map(str(path), num_classes=5)  # class 4 of 5: fine
    classes[0, 1, 1] = 5.0
    torch.save(torch.stack([scores, classes]), path)
    with pytest.raises(InputError, match=r'in \[0, 5\)'):
        read_label_map(str(path), num_classes=5)


# -------------------------------------------------------------- numpy arrays in checkpoints


def test_a_fortran_order_array_in_meta_round_trips(tmp_path):
    array = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    assert array.flags.f_contiguous and not array.flags.c_contiguous
    path = tmp_path / 'ckpt.pth'
    torch.save(dict(state_dict={'w': torch.zeros(1)}, meta=dict(a=array)), path)
    loaded = np.asarray(load_checkpoint_file(str(path))['meta']['a'])
    expected = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert loaded.shape == (3, 4) and loaded.tolist() == expected


# ------------------------------------------------------------------- own data: top-k


def test_five_classes_keep_top_5():
    metric = dict(type='Accuracy', topk=(1, 5))
    _clip_topk(metric, 5)
    assert metric['topk'] == (1, 5)
    _clip_topk(metric, 4)
    assert metric['topk'] == (1,)


# ----------------------------------------------------------------- PoolFormer LayerScale


def test_a_custom_poolformer_arch_starts_at_layer_scale_1e_5():
    model = PoolFormer(POOLFORMER_TINY)
    scales = [m for n, m in model.state_dict().items() if 'layer_scale' in n]
    assert scales and all(torch.equal(s, torch.full_like(s, 1e-5)) for s in scales)
