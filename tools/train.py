"""Train a detector or segmentor from an mmdet / mmseg config (mmrepa backbones included).

    python tools/train.py configs/retinanet_repa_swin_b_1x_coco.py [--work-dir DIR] [--resume]
"""
import argparse
import os
import os.path as osp

from mmengine.config import DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.apis import load_config, setup_cpu_distributed


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument('--resume', nargs='?', const='auto', metavar='CHECKPOINT',
                        help='resume from CHECKPOINT, or from the latest one in the work dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. model.backbone.idle_ratio=0.5')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher for distributed training')
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
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()


if __name__ == '__main__':
    main()
