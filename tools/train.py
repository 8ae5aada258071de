"""Train a detector, segmentor or classifier from an mmdet / mmseg / mmpretrain config.

    python tools/train.py CONFIG [--work-dir DIR] [--resume]
    python tools/train.py configs/repa_swin/retinanet_repa_swin_b_1x_coco.py

Before building anything it checks that the data, the pretrained weights and ``load_from``
exist, and names every missing path.
"""

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.integrations.cli.args import one_line_errors, tool_argument_parser, tool_config
from mmrepa.integrations.cli.distributed import check_strategy, setup_cpu_distributed
from mmrepa.integrations.cli.inputs import check_inputs
from mmrepa.integrations.cli.runner import build_runner, run


def parse_args():
    parser = tool_argument_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help="scale the learning rate from the config's auto_scale_lr."
        "base_batch_size (the paper's global batch) to the real one "
        '(processes x train_dataloader.batch_size), linearly',
    )
    parser.add_argument(
        '--resume',
        nargs='?',
        const='auto',
        metavar='CHECKPOINT',
        help='resume from CHECKPOINT, or from the latest one in the work dir',
    )
    return parser.parse_args()


@one_line_errors('tools/train.py')
def main():
    args = parse_args()
    cfg = tool_config(args)
    check_strategy(cfg)
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            raise SystemExit(
                f'tools/train.py: --auto-scale-lr: {args.config} has no '
                'auto_scale_lr.base_batch_size to scale from'
            )
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume:
        cfg.resume, cfg.load_from = True, args.resume
    # init_weights reads the Pretrained checkpoints before load_from / resume, so both count
    what = 'checkpoint to resume from' if cfg.get('resume') else 'checkpoint to start from'
    check_inputs(
        cfg,
        'tools/train.py',
        splits=('train', 'val'),
        pretrained=True,
        checkpoints=[(what, 'load_from', cfg.get('load_from'))],
    )
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    run(runner, 'train')


if __name__ == '__main__':
    main()
