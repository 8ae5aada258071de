"""One rank of tests/integration/test_fsdp.py's single 2-process launch (torchrun, gloo, CPU).

For each config given: train 4 iterations sharded (FlexibleRunner + FoldableFSDPStrategy, a
sharded checkpoint at 2 and 4) and test it folded; with CHECKS 'ddp' first train the same 4
iterations with DDP (the unsharded reference: the same per-rank batches); with 'resume' also
resume the sharded run from its iteration-2 checkpoint and train to 4; with 'bf16' also train
it sharded in bfloat16 mixed precision (configs/_base_/runtime/fsdp_bf16.py). The runs start
from one initial checkpoint (load_from: the sharded run loads an ordinary checkpoint into its
shards). A tiny RePa-Swin with LayerNorms trains 4 iterations in float64 under each sharding
strategy (a tiny DepthRepViT under FULL_SHARD), and rank 0 trains each in one process over
both ranks' batches. Then a tiny
RepOpt-VGG (random per-channel constants) trains 4 iterations with RepOptSGD and with
RepOptAdamW (CSLA clipping), sharded and under DDP, on the strategy without a Runner.
Every rank saves what it ended with to WORK/rank{r}.pth for the test to compare. Last, an
auto-wrap policy that splits a foldable block is tried, and its error message saved.

    python -m torch.distributed.run --nproc_per_node 2 tests/integration/fsdp_worker.py \
        WORK NAME=CONFIG=BLOCK_TYPES=CHECKS [...]
"""

import gc
import os
import os.path as osp
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config, ConfigDict
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.optim import build_optim_wrapper
from mmengine.runner import FlexibleRunner, Runner
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel

import mmrepa  # noqa: F401
from mmrepa.apis import build_model, load_config
from mmrepa.backbones import DepthRepViT, RePaSwin, RepOptVGG
from mmrepa.engine.strategies import FoldableFSDPStrategy, init_cpu_process_group
from mmrepa.errors import ConfigError
from mmrepa.integrations.cli.distributed import setup_cpu_distributed
from tests.helpers import (
    REPOPT_VGG_TINY,
    ROOT,
    TINY_ARCH,
    fresh_mmengine_instances,
    memoize_config_parsing,
)
from tests.integration.config_checks import TINY_ARCHS

# momentum, decay (not on BN and biases: the paramwise rules must see whole tensors) and a
# max_norm the CSLA gradient norm exceeds, so that the clipping acts
REPOPT = dict(
    constructor='RepOptOptimWrapperConstructor',
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
    clip_grad=dict(type='csla', max_norm=0.05),
)
REPOPT_OPTIMIZERS = dict(
    sgd=dict(type='RepOptSGD', lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    adamw=dict(type='RepOptAdamW', lr=0.01, weight_decay=0.05),
)


def config(path, work, name, **changes):
    cfg = load_config(path)
    cfg.merge_from_dict(dict(work_dir=osp.join(work, name), experiment_name=name, **changes))
    cfg.launcher = 'pytorch'
    return cfg


class RecordBatches(Hook):
    """Keeps the batches this rank trains on, in order."""

    def __init__(self):
        self.batches = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.batches.append(data_batch)


def sharded(path, work, name, blocks, test=True, wrapper=(), hooks=(), **changes):
    strategy = dict(
        type='FoldableFSDPStrategy',
        model_wrapper=dict(
            auto_wrap_policy=dict(type='foldable_block_policy', block_types=blocks), **dict(wrapper)
        ),
    )
    cfg = config(path, work, name, strategy=strategy, **changes)
    with fresh_mmengine_instances():
        runner = FlexibleRunner.from_cfg(cfg)
        for hook in hooks:
            runner.register_hook(hook)
        gc.freeze()  # as the tools do (mmrepa.integrations.cli.runner)
        runner.train()
        return runner, runner.strategy.full_model().state_dict(), test and runner.test()


class RepOptNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same weights and constants on every rank
        self.backbone = RepOptVGG(REPOPT_VGG_TINY, out_indices=(3,))
        self.backbone.init_weights()
        for layer in self.backbone.layers().values():
            s, t, i = torch.rand(3, layer.out_channels) + 0.5
            layer.set_scales(s, t, i)
        self.head = nn.Linear(self.backbone.num_features[3], 3)
        self.double()  # float64: the only difference to DDP is the order of the sums

    def forward(self, x):
        return self.head(self.backbone(x)[0].mean((2, 3)))


# backbones whose normalisation does not depend on the batch (LayerNorms), and their FSDP unit
LAYER_NORM_BACKBONES = {
    # one output: FSDP gives a parameter outside the loss a zero gradient (AdamW decays it),
    # one process none (AdamW skips it)
    'swin': (
        lambda: RePaSwin(TINY_ARCH, ffn_norm='LN', drop_path_rate=0.0, out_indices=(3,)),
        'RePaSwinBlock',
    ),
    # λ between the branches' two forms, so that both take part
    'depth': (
        lambda: DepthRepViT(TINY_ARCHS['DepthRepViT'], depth=6, img_size=32, join_lambda=0.5),
        'JoinedBlock',
    ),
}


class LayerNormNet(nn.Module):
    """A tiny backbone with LayerNorms only (no statistic depends on how the batch is split)
    and a linear head, in float64."""

    def __init__(self, backbone):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = LAYER_NORM_BACKBONES[backbone][0]()
        widths = getattr(self.backbone, 'num_features', [self.backbone.embed_dims])
        self.head = nn.Linear(widths[-1], 3)
        self.double()

    def forward(self, x):
        out = self.backbone(x)[-1]
        return self.head(out.mean((2, 3)) if out.ndim == 4 else out)


def one_process_reference(backbone, modes):
    """``{sharding strategy or 'single': parameters}``: 4 AdamW steps of a
    :class:`LayerNormNet` in float64, each rank on its half of every batch under FSDP, and
    (rank 0) one process on the whole batches: the mean loss over both halves has the mean of
    the ranks' gradients, what FSDP's reduction computes."""
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(4, 3, 32, 32, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (4,), generator=g),
        )
        for _ in range(4)
    ]
    half = slice(2 * get_rank(), 2 * get_rank() + 2)
    optim = ConfigDict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05))
    block = LAYER_NORM_BACKBONES[backbone][1]
    out = {}
    for mode in modes:
        policy = dict(type='foldable_block_policy', block_types=[block])  # mmengine pops 'type'
        strategy = FoldableFSDPStrategy(
            skip_init_weights=True,
            model_wrapper=dict(sharding_strategy=mode, auto_wrap_policy=policy),
        )
        model, wrapper = strategy.prepare(LayerNormNet(backbone), optim_wrapper=optim)
        for x, y in batches:
            wrapper.update_params(F.cross_entropy(model(x[half]), y[half]))
        with FSDP.summon_full_params(model, writeback=False):
            out[mode] = {
                k.replace('_fsdp_wrapped_module.', ''): v.detach().clone()
                for k, v in model.named_parameters()
            }
    if get_rank() == 0:
        model = LayerNormNet(backbone)
        wrapper = build_optim_wrapper(model, optim)
        for x, y in batches:
            wrapper.update_params(F.cross_entropy(model(x), y))
        out['single'] = {k: v.detach().clone() for k, v in model.named_parameters()}
    return out


def train_repopt(model, optim_wrapper):
    """4 iterations, each rank its own batch; the CSLA gradient norm of each step."""
    g = torch.Generator().manual_seed(get_rank())
    norms = []
    for _ in range(4):
        x = torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (2,), generator=g)
        optim_wrapper.update_params(F.cross_entropy(model(x), y))
        norms.append(MessageHub.get_current_instance().get_scalar('train/grad_norm').current())
    return norms


def decays(model, optimizer):
    names = {p: n.replace('_fsdp_wrapped_module.', '') for n, p in model.named_parameters()}
    return {names[p]: g['weight_decay'] for g in optimizer.param_groups for p in g['params']}


def repopt(name):
    """``{ddp, fsdp}: (state dict, CSLA gradient norms, weight decay by parameter)`` of one
    RepOpt optimizer."""
    cfg = dict(REPOPT, optimizer=REPOPT_OPTIMIZERS[name])
    out = {}
    ddp = DistributedDataParallel(RepOptNet())
    wrapper = build_optim_wrapper(ddp, ConfigDict(cfg))
    norms = train_repopt(ddp, wrapper)
    state = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    out['ddp'] = (state, norms, decays(ddp.module, wrapper.optimizer))
    strategy = FoldableFSDPStrategy(
        skip_init_weights=True,
        model_wrapper=dict(
            auto_wrap_policy=dict(type='foldable_block_policy', block_types=['RepOptConvBN'])
        ),
    )
    model, wrapper = strategy.prepare(RepOptNet(), optim_wrapper=ConfigDict(cfg))
    norms = train_repopt(model, wrapper)
    with FSDP.summon_full_params(model, writeback=False):
        state = {k: v.detach().clone() for k, v in model.named_parameters()}
    state.update((k, v.clone()) for k, v in model.named_buffers())
    state = {k.replace('_fsdp_wrapped_module.', ''): v for k, v in state.items()}
    out['fsdp'] = (state, norms, decays(model, wrapper.optimizer))
    return out


def losses(runner):
    return [float(v) for v in runner.message_hub.get_scalar('train/loss').data[0]]


def main(work, *named):
    # as in the test workers: each rank loads the two configs nine times
    memoize_config_parsing()
    init_cpu_process_group('pytorch')
    out = {}
    for item in named:
        name, path, blocks, checks = item.split('=')
        blocks, checks, result = blocks.split(','), checks.split(','), {}
        # the runs start from the same weights: the runners draw different random numbers
        # between seeding and building the model
        init = osp.join(work, f'{name}_init.pth')
        if get_rank() == 0:
            torch.manual_seed(0)
            model = build_model(Config.fromfile(path))
            model.init_weights()
            os.makedirs(work, exist_ok=True)
            torch.save(dict(state_dict=model.state_dict()), init)
        dist.barrier()
        if 'ddp' in checks:
            cfg = config(path, work, f'{name}_ddp', load_from=init)
            setup_cpu_distributed(cfg)
            with fresh_mmengine_instances():
                runner = Runner.from_cfg(cfg)
                runner.train()
                result['ddp'] = {k: v.clone() for k, v in runner.model.module.state_dict().items()}
        record = RecordBatches()
        runner, result['fsdp'], result['fsdp_metrics'] = sharded(
            path, work, f'{name}_fsdp', blocks, hooks=[record], load_from=init
        )
        result['fsdp_losses'], result['fsdp_batches'] = losses(runner), record.batches
        if 'bf16' in checks:
            bf16 = Config.fromfile(osp.join(ROOT, 'configs/_base_/runtime/fsdp_bf16.py'))
            wrapper = dict(mixed_precision=bf16.strategy.model_wrapper.mixed_precision)
            record = RecordBatches()
            runner, result['bf16'], result['bf16_metrics'] = sharded(
                path, work, f'{name}_bf16', blocks, wrapper=wrapper, hooks=[record], load_from=init
            )
            result['bf16_losses'], result['bf16_batches'] = losses(runner), record.batches
            result['init'] = torch.load(init, weights_only=True)['state_dict']
            # as the sharded model holds them: the buffers' dtype, the optimizer's pieces
            result['bf16_buffers'] = {n: b.clone() for n, b in runner.strategy._buffers()}
            result['bf16_pieces'] = {
                n: p.detach().clone() for n, (p, *_) in runner.strategy._pieces().items()
            }
        if 'resume' in checks:
            ckpt = osp.join(work, f'{name}_fsdp', 'iter_2.pth')
            _, result['resumed'], _ = sharded(
                path, work, f'{name}_resumed', blocks, test=False, resume=True, load_from=ckpt
            )
        out[name] = result
    out['reference'] = {
        'swin': one_process_reference('swin', ('FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD')),
        'depth': one_process_reference('depth', ('FULL_SHARD',)),
    }
    out['repopt'] = {name: repopt(name) for name in REPOPT_OPTIMIZERS}
    path = named[0].split('=')[1]
    try:  # one unit per Linear: inside the foldable blocks
        sharded(path, work, 'split', ['Linear'])
    except ConfigError as e:
        out['split_error'] = str(e)
    torch.save(out, osp.join(work, f'rank{get_rank()}.pth'))


if __name__ == '__main__':
    main(*sys.argv[1:])
