"""Test a checkpoint with an mmdet / mmseg config; ``--reparam`` tests the folded model.

    python tools/test.py CONFIG CHECKPOINT [--reparam] [--work-dir DIR]

With ``--reparam`` the ReparameterizeHook folds the backbone after the checkpoint is loaded,
checks the folded outputs against the original on a test batch and logs the per-image latency
of both before testing the folded model.
"""
import argparse
import json
import os
import os.path as osp

from mmengine.config import DictAction
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.apis import load_config, setup_cpu_distributed


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where logs and metrics go')
    parser.add_argument('--reparam', action='store_true',
                        help='fold the model before testing (ReparameterizeHook)')
    parser.add_argument('--latency-batches', type=int, default=10, metavar='N',
                        help='with --reparam: test batches timed before/after folding '
                        '(0 to skip timing)')
    parser.add_argument('--dump-metrics', metavar='FILE.json',
                        help='also write the metrics to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. test_dataloader.batch_size=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher for distributed testing')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main():
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    setup_cpu_distributed(cfg)
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs', osp.splitext(osp.basename(args.config))[0])
    cfg.load_from = args.checkpoint
    if args.reparam:
        cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
            dict(type='ReparameterizeHook', verify=True,
                 measure_latency=args.latency_batches > 0,
                 num_batches=max(1, args.latency_batches))
        ]
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    metrics = runner.test()
    if args.dump_metrics and is_main_process():
        with open(args.dump_metrics, 'w') as f:
            json.dump({k: float(v) if isinstance(v, (int, float)) or hasattr(v, 'item') else v
                       for k, v in metrics.items()}, f, indent=2)


if __name__ == '__main__':
    main()
