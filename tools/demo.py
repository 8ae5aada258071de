"""Learn, fold and check one model per task family on generated data (``make demo``: all).

For every task (``--task``, default ``all``):

1. generate its small data set under ``data/`` (seconds; kept for the next run);
2. train its demo config (``configs/demo/``) from scratch with ``tools/train.py``;
3. test the checkpoint with ``tools/test.py`` as trained, then with ``--reparam`` (folded, with
   the latency table; its predictions drawn on the test images in WORK_DIR/TASK/pictures/),
   and check that the model learned (the metric clears the task's bar) and that folding leaves
   the metric unchanged.

task            model, data                      backbone         metric >= bar (default)
retinanet       RetinaNet, COCO-format shapes    RePa-Swin        bbox mAP >= 0.3
mask-rcnn       Mask R-CNN, the same set         PRepBN-Swin      bbox and mask mAP >= 0.3
upernet         UperNet, ADE20K-layout shapes    RePa-ConvFormer  mIoU >= 70 (mmseg IoUMetric)
classification  classifier, one shape per image  RePa-CAFormer    top-1 >= 90 (mmpretrain)
repopt          the same, after a Hyper-Search    RepOpt-VGG       top-1 >= 90 (mmpretrain)

The repopt task first trains the Hyper-Search network (configs/demo/hs_repopt_vgg_shapes.py) and
exports its constants with tools/misc/repopt_export_scales.py; its config then trains the plain
network with RepOptSGD and those constants.

``--data-only`` generates the data sets alone (``data/demo_shapes/``, COCO format;
``data/demo_shapes_ade/``, ADE20K's layout; ``data/demo_shapes_cls/``, a folder per class) and
prints where: small examples of the layouts ``tools/train.py --data-root`` reads.

Each step prints one progress line; the tools' own output goes to a log file per step in the
task's work dir (WORK_DIR/TASK/*.log; --verbose prints it too). A summary table ends the run
and is written to WORK_DIR/summary.json; the exit status is 1 if any task failed, after the
per-class scores of a task that did not learn and what to try. Users with COCO / ADE20K run the
same tools on the configs in ``configs/``.
"""

import argparse
import json
import os
import os.path as osp
import resource
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


class Smoke(NamedTuple):
    """A task made short for ``--smoke``: a smaller set in its own folder, fewer epochs, bars
    still far above what an unlearned model reaches."""

    data: dict  # the data maker's sizes
    data_keys: Tuple[str, ...]  # the config's data_root options
    epochs: int
    bars: dict  # --min-... option: bar


class Task(NamedTuple):
    config: str
    make_data: Callable[..., str]  # (data_dir, **sizes) -> the data root
    metrics: Tuple[Metric, ...]
    # run before training, in the task's work dir; returns --cfg-options for train and test
    prepare: Optional[Callable[['Step', str, List[str]], List[str]]] = None
    smoke: Optional[Smoke] = None


class ToolFailed(Exception):
    """A tool exited non-zero; the message holds its last lines and its log."""


class Step:
    """Runs the tools of one task: one progress line per tool, its output in a log file."""

    def __init__(self, work_dir: str, verbose: bool):
        self.work_dir, self.verbose = work_dir, verbose

    def run(self, label: str, *args: str) -> None:
        os.makedirs(self.work_dir, exist_ok=True)
        log = osp.join(self.work_dir, label.replace(' ', '_') + '.log')
        cmd = [sys.executable, *args]
        shown = ' '.join(
            osp.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a for a in cmd[1:]
        )
        print(f'      {label:<14} {relative(log)}', end='', flush=True)
        # one compute thread per process: with the data-loader workers on the second core, two
        # OpenMP threads spin against them (and against anything else running) and train ~10x
        # slower on a 2-core machine; OMP_NUM_THREADS in the environment still wins
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
        start = time.time()
        with open(log, 'w') as out:
            out.write(f'+ {shown}\n')
            out.flush()
            if self.verbose:
                print(f'\n+ {shown}', flush=True)
                proc = subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for line in proc.stdout:
                    sys.stdout.write(line)
                    out.write(line)
                code = proc.wait()
            else:
                code = subprocess.run(
                    cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                ).returncode
        print(f'  {(time.time() - start) / 60:.1f} min', flush=True)
        if code:
            raise ToolFailed(
                f'{osp.basename(args[0])} exited with {code}; its last lines '
                f'({relative(log)}):\n' + '\n'.join(last_lines(log, 6))
            )


def cpu_minutes() -> float:
    """CPU time of the tools run so far (their loader workers too): unlike the wall time, it
    hardly moves with the machine's load."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) / 60


def relative(path: str) -> str:
    return osp.relpath(path) if path.startswith(os.getcwd() + os.sep) else path


def last_lines(path: str, count: int) -> List[str]:
    with open(path, errors='replace') as f:
        lines = [line.rstrip() for line in f if line.strip()]
    return ['        ' + line for line in lines[-count:]]


# the layout each generator writes, as tools/train.py --data-root reads it
LAYOUTS = {
    'make_shapes_coco': 'COCO format',
    'make_shapes_ade20k': "ADE20K's layout",
    'make_shapes_classification': 'a folder per class',
}


def _data(maker: str, name: str) -> Callable[..., str]:
    def make(data_dir: str, **sizes):
        from mmrepa import datasets

        folder = name + ('_smoke' if sizes else '')  # a smaller set beside the full one
        return getattr(datasets, maker)(osp.join(data_dir, folder), **sizes)

    make.layout = LAYOUTS[maker]
    return make


def hyper_search(step: Step, work_dir: str, train_options: List[str]) -> List[str]:
    """Train the Hyper-Search network, export its constants; the target's ``scales`` option."""
    config, hs_dir = osp.join(CONFIGS, 'hs_repopt_vgg_shapes.py'), osp.join(work_dir, 'hs')
    step.run(
        'hyper-search',
        osp.join(ROOT, 'tools', 'train.py'),
        config,
        '--work-dir',
        hs_dir,
        *cfg_options(train_options),
    )
    scales = osp.join(work_dir, 'scales.pth')
    step.run(
        'export scales',
        osp.join(ROOT, 'tools', 'misc', 'repopt_export_scales.py'),
        config,
        last_checkpoint(hs_dir),
        scales,
        '--force',
    )
    return [f'model.backbone.scales={scales}']


# Folding is exact up to float rounding, which can flip a few borderline detections or pixels:
# the tolerances allow that and nothing more (mAP in [0, 1]; mIoU and top-1 in %).
# --smoke (make test): the classification task on SMOKE_TRAIN images for SMOKE_EPOCHS epochs;
# chance top-1 is 33.3 %
SMOKE_TRAIN, SMOKE_VAL, SMOKE_EPOCHS, SMOKE_TOP1 = 1200, 150, 8, 50.0
BBOX = Metric('coco/bbox_mAP', 'bbox mAP', 'min_map', 0.002)
TOP1 = Metric('accuracy/top1', 'top-1', 'min_top1', 0.2)
TASKS = {
    'retinanet': Task(
        osp.join(CONFIGS, 'retinanet_repa_swin_shapes.py'),
        _data('make_shapes_coco', 'demo_shapes'),
        (BBOX,),
    ),
    'mask-rcnn': Task(
        osp.join(CONFIGS, 'mask-rcnn_prepbn_swin_shapes.py'),
        _data('make_shapes_coco', 'demo_shapes'),
        (BBOX, Metric('coco/segm_mAP', 'mask mAP', 'min_mask_map', 0.002)),
    ),
    'upernet': Task(
        osp.join(CONFIGS, 'upernet_repa_convformer_shapes.py'),
        _data('make_shapes_ade20k', 'demo_shapes_ade'),
        (Metric('mIoU', 'mIoU', 'min_miou', 0.2),),
    ),
    'classification': Task(
        osp.join(CONFIGS, 'classifier_repa_caformer_shapes.py'),
        _data('make_shapes_classification', 'demo_shapes_cls'),
        (TOP1,),
        smoke=Smoke(
            dict(num_train=SMOKE_TRAIN, num_val=SMOKE_VAL),
            tuple(f'{s}_dataloader.dataset.data_root' for s in ('train', 'val', 'test')),
            epochs=SMOKE_EPOCHS,
            bars=dict(min_top1=SMOKE_TOP1),
        ),
    ),
    'repopt': Task(
        osp.join(CONFIGS, 'repopt_vgg_shapes.py'),
        _data('make_shapes_classification', 'demo_shapes_cls'),
        (TOP1,),
        prepare=hyper_search,
    ),
}


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


def train_options(epochs: Optional[int], seed: Optional[int]) -> List[str]:
    """Options of another length (the cosine schedule and the checkpoint follow it: the same
    keys in every demo config) and another seed."""
    options = [f'randomness.seed={seed}'] if seed is not None else []
    if epochs:
        options += [
            f'train_cfg.max_epochs={epochs}',
            f'train_cfg.val_interval={epochs}',
            f'param_scheduler.1.end={epochs}',
            f'param_scheduler.1.T_max={epochs}',
            f'default_hooks.checkpoint.interval={epochs}',
        ]
    return options


def cfg_options(options: List[str]) -> List[str]:
    return ['--cfg-options', *options] if options else []


def last_checkpoint(work_dir: str) -> str:
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        return osp.join(work_dir, f.read().strip())  # join keeps an absolute path


def make_data(task: Task, args) -> str:
    """The task's data set (the smaller one of ``--smoke``) in ``--data-dir``; its folder."""
    return task.make_data(args.data_dir, **(task.smoke.data if args.smoke else {}))


def data_only(names: List[str], args) -> None:
    """``--data-only``: generate the tasks' data sets, say where and in which layout."""
    made = {}
    for name in names:
        root = make_data(TASKS[name], args)
        made.setdefault(root, (TASKS[name].make_data.layout, []))[1].append(name)
    for root, (layout, tasks) in made.items():
        print(f'{relative(root)}: {layout} (tasks {", ".join(tasks)})')


def run_task(task: Task, config: str, step: Step, args) -> dict:
    """Generate, (prepare,) train, test as trained and folded; the metrics of both tests."""
    root = make_data(task, args)
    options = [f'{key}={root}' for key in task.smoke.data_keys] if args.smoke else []
    train = train_options(args.epochs, args.seed)
    options += task.prepare(step, step.work_dir, train) if task.prepare else []
    step.run(
        'train',
        osp.join(ROOT, 'tools', 'train.py'),
        config,
        '--work-dir',
        step.work_dir,
        *cfg_options(train + options),
    )
    ckpt = last_checkpoint(step.work_dir)
    results = {}
    # the folded model draws its predictions on the test images: the pictures the demo leaves
    # (not --smoke, a check, whose test runs they would slow; docs/speed.md)
    pictures = [] if args.smoke else ['--show-dir', osp.join(step.work_dir, 'pictures')]
    for name, flags in (('trained', []), ('folded', ['--reparam', *pictures])):
        out = osp.join(step.work_dir, f'metrics_{name}.json')
        step.run(
            f'test {name}',
            osp.join(ROOT, 'tools', 'test.py'),
            config,
            ckpt,
            '--work-dir',
            step.work_dir,
            '--dump-metrics',
            out,
            *flags,
            *cfg_options(options),
        )
        with open(out) as f:
            results[name] = json.load(f)
    return results


def check(task: Task, results: dict, args) -> list:
    """Why the task fails: a metric below its bar or moved by folding (empty if it passes)."""
    problems = []
    for m in task.metrics:
        before, after = results['trained'][m.key], results['folded'][m.key]
        if abs(before - after) > m.tolerance:
            problems.append(
                f'folding changed the {m.name} by {after - before:+.3f} (tolerance {m.tolerance})'
            )
        bar = getattr(args, m.option)
        if before < bar:
            problems.append(
                f'{m.name} {before:.3f} < {bar} (--{m.option.replace("_", "-")}): it did not learn'
            )
    return problems


def per_class(results: dict, test_log: str) -> List[str]:
    """The per-class scores of the trained model's test: the tables mmdet (classwise) and
    mmseg print to the log, or mmpretrain's class-wise recall from the metrics."""
    recall = results.get('single-label/recall_classwise')
    if recall is not None:
        from mmrepa.datasets import SHAPE_CLASSES

        return [f'recall of {c}: {r:.1f} %' for c, r in zip(SHAPE_CLASSES, recall)]
    table, tables = [], []
    with open(test_log, errors='replace') as f:
        for line in f:
            if line.startswith(('+', '|')):
                table.append(line.rstrip())
            elif table:
                tables.append(table)
                table = []
    return [line for t in tables + [table] for line in t]


ADVICE = (
    'what to try: another seed (--seed 1), a longer schedule (--epochs, e.g. 1.5x the '
    "config's max_epochs), or the task alone with --verbose to watch its loss; see "
    'docs/troubleshooting.md, "The demo"'
)


def print_table(rows: List[tuple]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print('  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='\n'.join(__doc__.strip().splitlines()[1:]),
    )
    parser.add_argument(
        '--task',
        choices=[*TASKS, 'all'],
        default=None,
        help="default: all, or with --config the config's task",
    )
    parser.add_argument(
        '--config',
        help="one task's config instead of its own (e.g. "
        'configs/demo/retinanet_repa_caformer_shapes.py for retinanet)',
    )
    parser.add_argument(
        '--work-dir',
        default=osp.join(ROOT, 'work_dirs', 'demo'),
        help='each task writes to WORK_DIR/TASK',
    )
    parser.add_argument(
        '--data-dir',
        default=osp.join(ROOT, 'data'),
        help='where the generated data sets are kept (default: data/ of the repository)',
    )
    parser.add_argument(
        '--data-only',
        action='store_true',
        help="only generate the tasks' data sets (e.g. to try tools/train.py --data-root on "
        'them) and print their folders',
    )
    parser.add_argument('--epochs', type=int, default=None, help="override every task's max_epochs")
    parser.add_argument(
        '--seed', type=int, default=None, help="override every config's randomness.seed (0)"
    )
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='a short check that the task still learns (make test runs it): '
        f'classification on {SMOKE_TRAIN} images for {SMOKE_EPOCHS} epochs, '
        f'top-1 bar {SMOKE_TOP1:g}, no pictures',
    )
    parser.add_argument(
        '--verbose',
        action='store_true',
        help="print the tools' output too (it always goes to the logs)",
    )
    add_bar_arguments(parser)
    args = parser.parse_args()
    resolve_task(parser, args)
    return args


def add_bar_arguments(parser) -> None:
    """The bars: what a model that learned nothing cannot reach (see docs/demo.md)."""
    parser.add_argument(
        '--min-map',
        type=float,
        default=0.3,
        help='bbox mAP bar of retinanet and mask-rcnn; a detector that has '
        'not learned scores ~0 (default: %(default)s)',
    )
    parser.add_argument(
        '--min-mask-map',
        type=float,
        default=0.3,
        help='mask mAP bar of mask-rcnn (default: %(default)s)',
    )
    parser.add_argument(
        '--min-miou',
        type=float,
        default=70.0,
        help='mIoU bar of upernet in %%; everything "background" scores 21, '
        'perfect masks with the shapes labelled at random 35-43 '
        '(default: %(default)s)',
    )
    parser.add_argument(
        '--min-top1',
        type=float,
        default=90.0,
        help='top-1 bar of classification and repopt in %%; chance is 33.3, '
        'the largest class 35 (default: %(default)s)',
    )


def resolve_task(parser, args) -> None:
    """``args.task`` from --config alone; --smoke's task, epochs and bars."""
    if args.task is None:  # --config alone: the task whose config name starts the same
        prefix = osp.basename(args.config or '').split('_')[0]
        args.task = next(
            (name for name, t in TASKS.items() if osp.basename(t.config).split('_')[0] == prefix),
            None,
        )
        if args.task is None and args.config:
            parser.error(f'which task is {args.config}? give --task')
        args.task = args.task or 'all'
    if args.config and args.task == 'all':
        parser.error("--config replaces one task's config: give --task too")
    if args.smoke:
        if args.task == 'all':
            args.task = next(name for name, t in TASKS.items() if t.smoke)
        smoke = TASKS[args.task].smoke
        if smoke is None:
            parser.error(
                f'--smoke: the {args.task} task has no short form; '
                f'give --task {" or ".join(n for n, t in TASKS.items() if t.smoke)}'
            )
        args.epochs = args.epochs or smoke.epochs
        for option, bar in smoke.bars.items():  # unless given on the command line
            if getattr(args, option) == parser.get_default(option):
                setattr(args, option, bar)


# the keys of a summary.json task entry, in the order of a summary table row
SUMMARY_KEYS = ('task', 'backbone', 'metric', 'bar', 'trained', 'folded', 'minutes', 'result')


def run_one(i: int, name: str, names: List[str], args) -> Tuple[list, list, Optional[tuple]]:
    """Run task ``name`` (the ``i``-th of ``names``): its rows of the summary table, its
    entries of summary.json, and (name, problems, per-class scores) if it failed."""
    task = TASKS[name]
    config = osp.abspath(args.config) if args.config else task.config
    backbone = backbone_name(config)
    print(f'[{i}/{len(names)}] {name}: {backbone}, {relative(config)}', flush=True)
    step = Step(osp.join(args.work_dir, name), args.verbose)
    start, cpu_start = time.time(), cpu_minutes()
    details = []
    try:
        results = run_task(task, config, step, args)
    except ToolFailed as err:  # the tool has said why; go on with the next task
        results, problems = None, [str(err)]
    else:
        problems = check(task, results, args)
        if any('did not learn' in p for p in problems):
            details = per_class(results['trained'], osp.join(step.work_dir, 'test_trained.log'))
    minutes, cpu = (time.time() - start) / 60, cpu_minutes() - cpu_start
    rows, summary = [], []
    for m in task.metrics:
        values = [results[k][m.key] for k in ('trained', 'folded')] if results else [None] * 2
        result = 'FAILED' if problems else 'ok'
        rows.append(
            (name, backbone, m.name, str(getattr(args, m.option)), *values, minutes, result)
        )
        summary.append(dict(zip(SUMMARY_KEYS, rows[-1]), cpu_minutes=cpu))
    status = 'ok' if not problems else 'FAILED: ' + problems[0].splitlines()[0]
    print(f'      {name}: {status} ({minutes:.1f} min)', flush=True)
    return rows, summary, (name, problems, details) if problems else None


def write_summary(args, names, rows, summary, failed, total: float, machine: dict) -> None:
    """The summary table, and WORK_DIR/summary.json."""
    from mmrepa.utils.files import write_json
    from mmrepa.utils.machine import finish

    header = ('task', 'backbone', 'metric', 'bar', 'as trained', 'folded', 'minutes', 'result')
    cells = [header] + [
        (t, b, m, bar, *('-' if v is None else f'{v:.3f}' for v in (x, y)), f'{mins:.1f}', res)
        for t, b, m, bar, x, y, mins, res in rows
    ]
    print(
        f'\n===== demo summary: {len(names) - len(failed)} of {len(names)} tasks passed, '
        f'{total:.1f} min ({cpu_minutes():.1f} min of CPU time) ====='
    )
    print_table(cells)
    # atomic: a killed demo leaves the old summary, never half a file
    write_json(
        dict(
            tasks=summary,
            minutes=total,
            cpu_minutes=cpu_minutes(),
            seed=args.seed,
            epochs=args.epochs,
            smoke=args.smoke,
            machine=finish(machine),
        ),
        osp.join(args.work_dir, 'summary.json'),
    )


def main():
    args = parse_args()
    sys.path.insert(0, ROOT)
    import mmrepa.integrations.cli  # noqa: F401  the tools' seams, before any config loads
    from mmrepa.utils.machine import machine_info

    names = list(TASKS) if args.task == 'all' else [args.task]
    if args.data_only:
        return data_only(names, args)
    rows, failed, summary = [], [], []
    machine = machine_info()
    # the tools' threads, not this process's: OMP_NUM_THREADS, 1 unless set (Step.run)
    machine['omp_num_threads'] = os.environ.get('OMP_NUM_THREADS', '1')
    machine['threads'] = int(machine['omp_num_threads'])
    begin = time.time()
    for i, name in enumerate(names, 1):
        task_rows, task_summary, failure = run_one(i, name, names, args)
        rows += task_rows
        summary += task_summary
        if failure:
            failed.append(failure)
    write_summary(args, names, rows, summary, failed, (time.time() - begin) / 60, machine)
    if failed:
        print()
        for name, problems, details in failed:
            print(f'{name} failed: ' + '\n  '.join(problems))
            if details:
                print('  per class, as trained:\n    ' + '\n    '.join(details))
                print('  ' + ADVICE)
        sys.exit(f'demo failed: {", ".join(n for n, _, _ in failed)} (see above)')
    print(
        f'\ndemo ok: {", ".join(names)} learned (every metric clears its bar), and the '
        'folded models score the same.'
    )


if __name__ == '__main__':
    main()
