"""Learn, fold and check one model per task family on generated data (``make demo``: all).

For every task (``--task``, default ``all``):

1. generate its small data set under ``data/`` (seconds; kept for the next run);
2. train its demo config (``configs/demo/``) from scratch with ``tools/train.py``;
3. test the checkpoint with ``tools/test.py`` as trained, then with ``--reparam`` (folded, with
   the latency table), and check that the model learned (the metric clears the task's bar)
   and that folding leaves the metric unchanged.

task            model, data                      backbone         metric >= bar (default)
retinanet       RetinaNet, COCO-format shapes    RePa-Swin        bbox mAP >= 0.3
mask-rcnn       Mask R-CNN, the same set         PRepBN-Swin      bbox and mask mAP >= 0.3
upernet         UperNet, ADE20K-layout shapes    RePa-ConvFormer  mIoU >= 70 (mmseg IoUMetric)
classification  classifier, one shape per image  RePa-CAFormer    top-1 >= 90 (mmpretrain)
repopt          the same, after a Hyper-Search    RepOpt-VGG       top-1 >= 90 (mmpretrain)

The repopt task first trains the Hyper-Search network (configs/demo/hs_repopt_vgg_shapes.py) and
exports its constants with tools/misc/repopt_export_scales.py; its config then trains the plain
network with RepOptSGD and those constants.

A summary table (metric as trained and folded, minutes per task) ends the run; the exit status
is 1 if any task failed. Users with COCO / ADE20K run the same tools on the configs in
``configs/``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import Callable, List, NamedTuple, Optional, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = osp.join(ROOT, 'configs', 'demo')


class Metric(NamedTuple):
    key: str  # in tools/test.py --dump-metrics
    name: str  # in the summary
    option: str  # the --min-... option that holds its bar
    tolerance: float  # largest change folding may cause (metric units)


class Task(NamedTuple):
    config: str
    make_data: Callable[[], str]
    metrics: Tuple[Metric, ...]
    # run before training, in the task's work dir; returns --cfg-options for train and test
    prepare: Optional[Callable[[str, Optional[int]], List[str]]] = None


def _data(maker: str, name: str) -> Callable[[], str]:
    def make():
        from mmrepa import datasets
        return getattr(datasets, maker)(osp.join(ROOT, 'data', name))
    return make


def hyper_search(work_dir: str, epochs: Optional[int]) -> List[str]:
    """Train the Hyper-Search network, export its constants; the target's ``scales`` option."""
    config, hs_dir = osp.join(CONFIGS, 'hs_repopt_vgg_shapes.py'), osp.join(work_dir, 'hs')
    run(osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir', hs_dir,
        *epoch_options(epochs))
    scales = osp.join(work_dir, 'scales.pth')
    run(osp.join(ROOT, 'tools', 'misc', 'repopt_export_scales.py'), config,
        last_checkpoint(hs_dir), scales, '--force')
    return [f'model.backbone.scales={scales}']


# Folding is exact up to float rounding, which can flip a few borderline detections or pixels:
# the tolerances allow that and nothing more (mAP in [0, 1]; mIoU and top-1 in %).
BBOX = Metric('coco/bbox_mAP', 'bbox mAP', 'min_map', 0.002)
TOP1 = Metric('accuracy/top1', 'top-1', 'min_top1', 0.2)
TASKS = {
    'retinanet': Task(osp.join(CONFIGS, 'retinanet_repa_swin_shapes.py'),
                      _data('make_shapes_coco', 'demo_shapes'), (BBOX, )),
    'mask-rcnn': Task(osp.join(CONFIGS, 'mask-rcnn_prepbn_swin_shapes.py'),
                      _data('make_shapes_coco', 'demo_shapes'),
                      (BBOX, Metric('coco/segm_mAP', 'mask mAP', 'min_mask_map', 0.002))),
    'upernet': Task(osp.join(CONFIGS, 'upernet_repa_convformer_shapes.py'),
                    _data('make_shapes_ade20k', 'demo_shapes_ade'),
                    (Metric('mIoU', 'mIoU', 'min_miou', 0.2), )),
    'classification': Task(osp.join(CONFIGS, 'classifier_repa_caformer_shapes.py'),
                           _data('make_shapes_classification', 'demo_shapes_cls'),
                           (TOP1, )),
    'repopt': Task(osp.join(CONFIGS, 'repopt_vgg_shapes.py'),
                   _data('make_shapes_classification', 'demo_shapes_cls'), (TOP1, ),
                   prepare=hyper_search),
}


def run(*args):
    cmd = [sys.executable, *args]
    print('+', ' '.join(osp.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a
                        for a in cmd[1:]), flush=True)
    # one compute thread per process: with the data-loader workers on the second core, two
    # OpenMP threads spin against them (and against anything else running) and train ~10x
    # slower on a 2-core machine; OMP_NUM_THREADS in the environment still wins
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)


def backbone_name(config: str) -> str:
    """The backbone family of a config, as the README names it (RePa-Swin, PRepBN-Swin, ...)."""
    from mmengine.config import Config
    backbone = Config.fromfile(config).model.backbone
    kind = backbone.type.split('.')[-1]
    if kind in ('RePaSwin', 'PRepBNSwin'):
        return kind[:-4] + '-Swin'
    if kind == 'RepOptVGG':
        return 'RepOpt-VGG'
    idle = backbone.get('idle_ratio', 0)
    return f'RePa-{kind}' if kind in ('ConvFormer', 'CAFormer') and idle else kind


def epoch_options(epochs: Optional[int]) -> List[str]:
    """--cfg-options of another length: the cosine schedule and the checkpoint follow it (the
    same keys in every demo config)."""
    return ['--cfg-options', f'train_cfg.max_epochs={epochs}', f'train_cfg.val_interval={epochs}',
            f'param_scheduler.1.end={epochs}', f'param_scheduler.1.T_max={epochs}',
            f'default_hooks.checkpoint.interval={epochs}'] if epochs else []


def last_checkpoint(work_dir: str) -> str:
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return osp.join(work_dir, f.read().strip())  # join keeps an absolute path


def run_task(task: Task, config: str, work_dir: str, epochs) -> dict:
    """Generate, (prepare,) train, test as trained and folded; the metrics of both tests."""
    task.make_data()
    options = task.prepare(work_dir, epochs) if task.prepare else []
    extra = epoch_options(epochs)
    if options:
        extra = (extra or ['--cfg-options']) + options
    run(osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir', work_dir, *extra)
    ckpt = last_checkpoint(work_dir)
    test_extra = ['--cfg-options', *options] if options else []
    results = {}
    for name, flags in (('trained', []), ('folded', ['--reparam'])):
        out = osp.join(work_dir, f'metrics_{name}.json')
        run(osp.join(ROOT, 'tools', 'test.py'), config, ckpt, '--work-dir', work_dir,
            '--dump-metrics', out, *flags, *test_extra)
        with open(out) as f:
            results[name] = json.load(f)
    return results


def check(task: Task, results: dict, args) -> list:
    """Why the task fails: a metric below its bar or moved by folding (empty if it passes)."""
    problems = []
    for m in task.metrics:
        before, after = results['trained'][m.key], results['folded'][m.key]
        if abs(before - after) > m.tolerance:
            problems.append(f'folding changed the {m.name} by {after - before:+.3f} '
                            f'(tolerance {m.tolerance})')
        bar = getattr(args, m.option)
        if before < bar:
            problems.append(f'{m.name} {before:.3f} < {bar} (--{m.option.replace("_", "-")}): '
                            'it did not learn')
    return problems


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='\n'.join(__doc__.strip().splitlines()[1:]))
    parser.add_argument('--task', choices=[*TASKS, 'all'], default=None,
                        help="default: all, or with --config the config's task")
    parser.add_argument('--config', help="one task's config instead of its own (e.g. "
                        'configs/demo/retinanet_repa_caformer_shapes.py for retinanet)')
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'),
                        help='each task writes to WORK_DIR/TASK')
    parser.add_argument('--epochs', type=int, default=None,
                        help="override every task's max_epochs")
    # the bars: what a model that learned nothing cannot reach (see the README's demo table)
    parser.add_argument('--min-map', type=float, default=0.3,
                        help='bbox mAP bar of retinanet and mask-rcnn; a detector that has '
                        'not learned scores ~0 (default: %(default)s)')
    parser.add_argument('--min-mask-map', type=float, default=0.3,
                        help='mask mAP bar of mask-rcnn (default: %(default)s)')
    parser.add_argument('--min-miou', type=float, default=70.0,
                        help='mIoU bar of upernet in %%; everything "background" scores 21, '
                        'perfect masks with the shapes labelled at random 35-43 '
                        '(default: %(default)s)')
    parser.add_argument('--min-top1', type=float, default=90.0,
                        help='top-1 bar of classification and repopt in %%; chance is 33.3, '
                        'the largest class 35 (default: %(default)s)')
    args = parser.parse_args()

    sys.path.insert(0, ROOT)
    if args.task is None:  # --config alone: the task whose config name starts the same
        prefix = osp.basename(args.config or '').split('_')[0]
        args.task = next((name for name, t in TASKS.items()
                          if osp.basename(t.config).split('_')[0] == prefix), None)
        if args.task is None and args.config:
            parser.error(f'which task is {args.config}? give --task')
        args.task = args.task or 'all'
    if args.config and args.task == 'all':
        parser.error('--config replaces one task\'s config: give --task too')
    names = list(TASKS) if args.task == 'all' else [args.task]

    rows, failed = [], []
    for name in names:
        task = TASKS[name]
        config = osp.abspath(args.config) if args.config else task.config
        start = time.time()
        try:
            results = run_task(task, config, osp.join(args.work_dir, name), args.epochs)
        except subprocess.CalledProcessError as err:  # the tool has said why; go on
            results, problems = None, [f'{osp.basename(err.cmd[1])} exited with {err.returncode}']
        else:
            problems = check(task, results, args)
        minutes = (time.time() - start) / 60
        backbone = backbone_name(config)
        for m in task.metrics:
            values = [results[k][m.key] for k in ('trained', 'folded')] if results else [None] * 2
            rows.append((name, backbone, m.name, *values, minutes))
        if problems:
            failed.append(f'{name}: ' + '; '.join(problems))

    header = ('task', 'backbone', 'metric', 'as trained', 'folded', 'minutes')
    cells = [header] + [(t, b, m, *('-' if v is None else f'{v:.3f}' for v in (x, y)),
                         f'{mins:.1f}') for t, b, m, x, y, mins in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print()
    for row in cells:
        print('  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if failed:
        sys.exit('demo failed:\n  ' + '\n  '.join(failed))
    print(f'\ndemo ok: {", ".join(names)} learned (every metric clears its bar), and the '
          'folded models score the same.')


if __name__ == '__main__':
    main()
