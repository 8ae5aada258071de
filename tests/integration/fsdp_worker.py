"""One rank of tests/integration/test_fsdp.py's single 2-process launch (torchrun, gloo, CPU).

For each config given: train 4 iterations sharded (FlexibleRunner + FoldableFSDPStrategy, a
sharded checkpoint at 2 and 4) and test it folded; with CHECKS 'ddp' first train the same 4
iterations with DDP (the unsharded reference: the same per-rank batches); with 'resume' also
resume the sharded run from its iteration-2 checkpoint and train to 4. The runs start from one
initial checkpoint (load_from: the sharded run loads an ordinary checkpoint into its shards).
Every rank saves what it ended with to WORK/rank{r}.pth for the test to compare. Last, an
auto-wrap policy that splits a foldable block is tried, and its error message saved.

    python -m torch.distributed.run --nproc_per_node 2 tests/integration/fsdp_worker.py \
        WORK NAME=CONFIG=BLOCK_TYPES=CHECKS [...]
"""

import os
import os.path as osp
import sys

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.dist import get_rank
from mmengine.runner import FlexibleRunner, Runner

import mmrepa  # noqa: F401
from mmrepa.apis import build_model
from mmrepa.engine.strategies import init_cpu_process_group
from mmrepa.errors import ConfigError
from mmrepa.integrations.cli.distributed import setup_cpu_distributed
from tests.helpers import fresh_mmengine_instances


def config(path, work, name, **changes):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(dict(work_dir=osp.join(work, name), experiment_name=name, **changes))
    cfg.launcher = 'pytorch'
    return cfg


def sharded(path, work, name, blocks, test=True, **changes):
    strategy = dict(
        type='FoldableFSDPStrategy',
        model_wrapper=dict(auto_wrap_policy=dict(type='foldable_block_policy', block_types=blocks)),
    )
    cfg = config(path, work, name, strategy=strategy, **changes)
    with fresh_mmengine_instances():
        runner = FlexibleRunner.from_cfg(cfg)
        runner.train()
        return runner, runner.strategy.full_model().state_dict(), test and runner.test()


def main(work, *named):
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
        _, result['fsdp'], result['fsdp_metrics'] = sharded(
            path, work, f'{name}_fsdp', blocks, load_from=init
        )
        if 'resume' in checks:
            ckpt = osp.join(work, f'{name}_fsdp', 'iter_2.pth')
            _, result['resumed'], _ = sharded(
                path, work, f'{name}_resumed', blocks, test=False, resume=True, load_from=ckpt
            )
        out[name] = result
    path = named[0].split('=')[1]
    try:  # one unit per Linear: inside the foldable blocks
        sharded(path, work, 'split', ['Linear'])
    except ConfigError as e:
        out['split_error'] = str(e)
    torch.save(out, osp.join(work, f'rank{get_rank()}.pth'))


if __name__ == '__main__':
    main(*sys.argv[1:])
