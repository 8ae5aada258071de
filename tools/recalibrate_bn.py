"""Re-estimate a checkpoint's BatchNorm statistics on training data, weights frozen.

    python tools/recalibrate_bn.py CONFIG CHECKPOINT OUT.pth [--num-batches N]

Builds the model and the training data loader of CONFIG, loads CHECKPOINT's ``state_dict``,
recalibrates the backbone's BatchNorm statistics over N training batches with drop-path off
(``mmrepa.engine.recalibrate_model_bn``) and writes OUT.pth: the same checkpoint with the new
statistics. Before building anything it checks that the training data and CHECKPOINT exist
and that OUT.pth is none of the inputs (CHECKPOINT, CONFIG, the data) nor a link to one: an
existing OUT.pth is replaced, atomically (a temporary file beside it, renamed at the end).
"""

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.checkpoint.saving import save_atomically
from mmrepa.config.inputs import config_inputs
from mmrepa.engine import recalibrate_model_bn
from mmrepa.integrations.cli.args import one_line_errors, tool_argument_parser, tool_config
from mmrepa.integrations.cli.inputs import check_inputs
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.integrations.cli.runner import build_runner

TOOL = 'tools/recalibrate_bn.py'


def parse_args():
    # one process: the statistics are averaged on this process's batches only
    parser = tool_argument_parser(__doc__.strip().splitlines()[0], distributed=False)
    parser.add_argument('checkpoint', help='checkpoint to recalibrate')
    parser.add_argument('out', help='where to write the recalibrated checkpoint')
    parser.add_argument(
        '--num-batches',
        type=int,
        default=200,
        metavar='N',
        help='training batches to average the statistics over (default 200)',
    )
    # its own log dir: the config's work_dir may hold the training run
    parser.set_defaults(work_dir='work_dirs/recalibrate_bn')
    return parser.parse_args()


@one_line_errors(TOOL)
def main():
    args = parse_args()
    outputs = [('OUT', args.out)]
    check_outputs(TOOL, outputs, [('config', args.config), ('checkpoint', args.checkpoint)])
    cfg = tool_config(args)
    check_outputs(TOOL, outputs, config_inputs(cfg, splits=('train',)))
    cfg.load_from, cfg.resume = None, False
    check_inputs(
        cfg,
        'tools/recalibrate_bn.py',
        splits=('train',),
        checkpoints=[('checkpoint to recalibrate', 'CHECKPOINT argument', args.checkpoint)],
    )
    runner = build_runner(cfg)
    ckpt = load_checkpoint_file(args.checkpoint)  # restricted and checked, any scheme
    if 'state_dict' not in ckpt:
        raise SystemExit(
            f'{args.checkpoint} has no state_dict: give an mmengine checkpoint '
            "(a bare state dict can be wrapped as {'state_dict': ...})"
        )
    runner.model.load_state_dict(ckpt['state_dict'])
    loader = runner.build_dataloader(cfg.train_dataloader)
    used = recalibrate_model_bn(runner.model, loader, args.num_batches)
    ckpt['state_dict'] = runner.model.state_dict()
    save_atomically(ckpt, args.out)
    runner.logger.info(
        f'recalibrated the BatchNorm statistics on {used} training batches; wrote {args.out}'
    )


if __name__ == '__main__':
    main()
