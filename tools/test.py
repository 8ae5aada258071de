"""Test a checkpoint with an mmdet, mmseg or mmpretrain config; ``--reparam`` folds it first.

    python tools/test.py CONFIG CHECKPOINT [--reparam] [--work-dir DIR] [--data-root DIR]
        [--show-dir DIR] [--out results.pkl] [--dump-metrics metrics.json]

With ``--reparam`` the ReparameterizeHook folds the backbone after the checkpoint is loaded,
checks the folded outputs against the original on a test batch and logs the per-image latency
of both before testing the folded model. Before building anything it checks that the test data
and CHECKPOINT exist (the backbone's pretrained weights are not read when testing).

``--show-dir DIR`` draws the predictions on every test image with the config's visualization
hook and saves the pictures in DIR, as mmdet's, mmseg's and mmpretrain's own test tools do:
DIR/IMAGE for mmdet, DIR/vis_data/vis_image/test_IMAGE_N.png for mmseg (its visualizer's
save_dir), DIR/IMAGE_N.png for mmpretrain. A relative DIR is taken from the current directory
(mmdet's tool puts it under the work dir). ``--out FILE.pkl`` dumps every test image's
predictions (mmengine's ``DumpResults``; mmdet's ``DumpDetResults``, masks RLE-encoded).

No output may be an input (CHECKPOINT, CONFIG, the test data: data root, annotation file,
image folder) or a link to one, and ``--show-dir`` may not hold one; this is checked before
anything is built. The files are written atomically (a temporary file beside each, renamed at
the end), the pictures into a temporary folder beside DIR whose files are moved into DIR at the
end (DIR's other files are kept): a failed or killed test (Ctrl-C, SIGTERM) leaves no partial
output.
"""

import contextlib
import io
import os.path as osp

from mmengine.dist import is_main_process

import mmrepa  # noqa: F401  registers mmrepa and allow-lists mmengine checkpoint types
from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.config.inputs import config_inputs
from mmrepa.errors import ConfigError
from mmrepa.integrations.cli.args import one_line_errors, tool_argument_parser, tool_config
from mmrepa.integrations.cli.distributed import check_strategy, setup_cpu_distributed
from mmrepa.integrations.cli.inputs import check_inputs
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.integrations.cli.runner import build_runner, run
from mmrepa.utils.files import atomic_folder, atomic_output, write_json

TOOL = 'tools/test.py'


def parse_args():
    parser = tool_argument_parser(__doc__.strip().splitlines()[0])
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--reparam', action='store_true', help='fold the model before testing (ReparameterizeHook)'
    )
    parser.add_argument(
        '--latency-batches',
        type=int,
        default=10,
        metavar='N',
        help='with --reparam: test batches timed before/after folding (0 to skip timing)',
    )
    parser.add_argument(
        '--dump-metrics', metavar='FILE.json', help='also write the metrics to this JSON file'
    )
    parser.add_argument(
        '--show-dir', metavar='DIR', help='save the predictions drawn on every test image in DIR'
    )
    parser.add_argument(
        '--out',
        metavar='FILE.pkl',
        help='dump the predictions of every test image to this pickle file',
    )
    return parser.parse_args()


# the visualization hook each codebase's default runtime has, and how its test tool turns it on
VISUALIZATION_HOOKS = {
    'mmdet': 'DetVisualizationHook',
    'mmseg': 'SegVisualizationHook',
    'mmpretrain': 'VisualizationHook',
}


def show_predictions(cfg, show_dir: str) -> None:
    """Turn on the config's visualization hook to save every test image's predictions in
    ``show_dir`` (as the codebases' tools/test.py --show-dir; an absolute path, so that mmdet's
    hook does not put it under the work dir)."""
    scope = cfg.get('default_scope')
    if scope not in VISUALIZATION_HOOKS or 'visualizer' not in cfg:
        raise ConfigError(
            f'--show-dir: config {cfg.filename} has no visualizer to draw with '
            f'(default_scope {scope!r}, visualizer {cfg.get("visualizer")!r})'
        )
    hooks = cfg.setdefault('default_hooks', {})
    hook = hooks.get('visualization') or dict(type=VISUALIZATION_HOOKS[scope])
    hooks['visualization'] = hook
    show_dir = osp.abspath(show_dir)
    if scope == 'mmdet':
        hook.update(draw=True, test_out_dir=show_dir)
    elif scope == 'mmseg':  # the hook draws through the visualizer's storage backends
        hook.update(draw=True, interval=1)
        cfg.visualizer['save_dir'] = show_dir
    else:
        hook.update(enable=True, out_dir=show_dir, interval=1)


def check_picture_names(cfg, show_dir: str) -> None:
    """mmdet's hook saves each test image's picture as DIR/<the image's file name>: refuse a
    test set where two images (in different folders) have the same name, before testing."""
    import copy

    from mmdet.registry import DATASETS
    from mmengine.registry import DefaultScope

    dataset = copy.deepcopy(cfg.test_dataloader.dataset)
    # pycocotools prints its progress: errors before noise
    with DefaultScope.overwrite_default_scope('mmdet'), contextlib.redirect_stdout(io.StringIO()):
        dataset = DATASETS.build(dataset)
    seen = {}
    for i in range(len(dataset)):
        path = dataset.get_data_info(i)['img_path']
        name = osp.basename(path)
        if name in seen and seen[name] != path:
            raise ConfigError(
                f'--show-dir: the test images {seen[name]} and {path} would both be drawn to '
                f"{osp.join(show_dir, name)} (mmdet's hook names a picture by its image's file "
                'name): rename one of them'
            )
        seen[name] = path


def check_pickle_name(out: str) -> None:
    if not out.endswith(('.pkl', '.pickle')):
        raise ConfigError(f'--out {out}: the predictions are dumped as a pickle; name a .pkl file')


def dump_results_metric(cfg, out: str):
    """The metric that dumps every prediction to ``out`` (a pickle file)."""
    check_pickle_name(out)
    if cfg.get('default_scope') == 'mmdet':
        from mmdet.evaluation import DumpDetResults  # masks RLE-encoded, ground truth dropped

        return DumpDetResults(out_file_path=osp.abspath(out))
    from mmengine.evaluator import DumpResults

    return DumpResults(out_file_path=osp.abspath(out))


@one_line_errors(TOOL)
def main():
    args = parse_args()
    outputs = [
        ('--dump-metrics', args.dump_metrics),
        ('--out', args.out),
        ('--show-dir', args.show_dir, True),
    ]
    check_outputs(TOOL, outputs, [('config', args.config), ('checkpoint', args.checkpoint)])
    if args.out:
        check_pickle_name(args.out)
    cfg = tool_config(args)
    check_strategy(cfg)
    check_outputs(TOOL, outputs, config_inputs(cfg, splits=('test',)))
    cfg.load_from = args.checkpoint
    check_inputs(
        cfg,
        'tools/test.py',
        splits=('test',),
        checkpoints=[('checkpoint to test', 'CHECKPOINT argument', args.checkpoint)],
    )
    load_checkpoint_file(args.checkpoint)  # unreadable or foreign: stop before the runner writes
    with contextlib.ExitStack() as temporaries:
        run_test(cfg, args, temporaries)


def run_test(cfg, args, temporaries: contextlib.ExitStack) -> None:
    """Run the test; the outputs are written through temporaries entered on ``temporaries``
    and moved into place when it closes without an error."""
    # the ranks of a distributed run draw into one folder: DIR itself, not a temporary each
    distributed = cfg.get('launcher', 'none') != 'none'
    if args.show_dir and cfg.get('default_scope') == 'mmdet':
        check_picture_names(cfg, args.show_dir)
    if args.show_dir:
        show_predictions(
            cfg,
            args.show_dir
            if distributed
            else temporaries.enter_context(atomic_folder(args.show_dir, replace=False)),
        )
    setup_cpu_distributed(cfg)
    if args.reparam:
        cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
            dict(
                type='ReparameterizeHook',
                verify=True,
                measure_latency=args.latency_batches > 0,
                num_batches=max(1, args.latency_batches),
            )
        ]
        test_cfg = cfg.get('test_cfg') or {}
        if test_cfg.get('type', 'TestLoop') == 'TestLoop':  # restores the model on failure too
            cfg.test_cfg = dict(test_cfg, type='FoldedTestLoop')
    runner = build_runner(cfg)
    if args.out:  # every rank has the metric; the main process alone writes (a temporary)
        runner.test_evaluator.metrics.append(
            dump_results_metric(
                cfg,
                temporaries.enter_context(atomic_output(args.out))
                if is_main_process()
                else args.out,
            )
        )
    metrics = run(runner, 'test')
    if args.dump_metrics and is_main_process():
        write_json(
            {
                k: float(v) if isinstance(v, (int, float)) or hasattr(v, 'item') else v
                for k, v in metrics.items()
            },
            args.dump_metrics,
        )


if __name__ == '__main__':
    main()
