"""Test a checkpoint with an mmdet, mmseg or mmpretrain config; ``--reparam`` folds it first.

    python tools/test.py CONFIG CHECKPOINT [--reparam] [--work-dir DIR]

With ``--reparam`` the ReparameterizeHook folds the backbone after the checkpoint is loaded,
checks the folded outputs against the original on a test batch and logs the per-image latency
of both before testing the folded model. Before building anything it checks that the test data
and CHECKPOINT exist (the backbone's pretrained weights are not read when testing).
"""
import json

from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.apis import (one_line_errors, setup_cpu_distributed, tool_argument_parser,
                         tool_config)
from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.tool_inputs import check_inputs


def parse_args():
    parser = tool_argument_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--reparam', action='store_true',
                        help='fold the model before testing (ReparameterizeHook)')
    parser.add_argument('--latency-batches', type=int, default=10, metavar='N',
                        help='with --reparam: test batches timed before/after folding '
                        '(0 to skip timing)')
    parser.add_argument('--dump-metrics', metavar='FILE.json',
                        help='also write the metrics to this JSON file')
    return parser.parse_args()


@one_line_errors('tools/test.py')
def main():
    args = parse_args()
    cfg = tool_config(args)
    cfg.load_from = args.checkpoint
    check_inputs(cfg, 'tools/test.py', splits=('test', ),
                 checkpoints=[('checkpoint to test', 'CHECKPOINT argument', args.checkpoint)])
    load_checkpoint_file(args.checkpoint)  # unreadable or foreign: stop before the runner writes
    setup_cpu_distributed(cfg)
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
