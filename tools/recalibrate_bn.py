"""Re-estimate a checkpoint's BatchNorm statistics on training data, weights frozen.

    python tools/recalibrate_bn.py CONFIG CHECKPOINT OUT.pth [--num-batches N]

Builds the model and the training data loader of CONFIG, loads CHECKPOINT's ``state_dict``,
recalibrates the backbone's BatchNorm statistics over N training batches with drop-path off
(``mmrepa.engine.recalibrate_model_bn``) and writes OUT.pth: the same checkpoint with the new
statistics.
"""
import argparse

import torch
from mmengine.config import Config, DictAction
from mmengine.runner import Runner

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.engine import recalibrate_model_bn


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', help='config file (its train_dataloader is used)')
    parser.add_argument('checkpoint', help='checkpoint to recalibrate')
    parser.add_argument('out', help='where to write the recalibrated checkpoint')
    parser.add_argument('--num-batches', type=int, default=200, metavar='N',
                        help='training batches to average the statistics over (default 200)')
    parser.add_argument('--work-dir', default='work_dirs/recalibrate_bn',
                        help='where the runner logs')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_dataloader.batch_size=8')
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir
    cfg.load_from, cfg.resume = None, False
    runner = Runner.from_cfg(cfg)
    ckpt = torch.load(args.checkpoint, map_location='cpu')
    if 'state_dict' not in ckpt:
        raise SystemExit(f'{args.checkpoint} has no state_dict: give an mmengine checkpoint '
                         "(a bare state dict can be wrapped as {'state_dict': ...})")
    runner.model.load_state_dict(ckpt['state_dict'])
    loader = runner.build_dataloader(cfg.train_dataloader)
    used = recalibrate_model_bn(runner.model, loader, args.num_batches)
    ckpt['state_dict'] = runner.model.state_dict()
    torch.save(ckpt, args.out)
    runner.logger.info(f'recalibrated the BatchNorm statistics on {used} training batches; '
                       f'wrote {args.out}')


if __name__ == '__main__':
    main()
