"""What every tool in ``tools/`` shares on the command line: the runner tools' arguments and
their config (:func:`tool_argument_parser`, :func:`tool_config`), and the one place where
mmrepa's errors become an exit status (:func:`one_line_errors`)."""

import argparse
import contextlib
import os
import os.path as osp

from mmengine.config import Config, DictAction

from ...apis import load_config
from ...config.paths import find_config
from ...errors import ConfigError, MMRepaError
from .runner import freeze_loaded_objects


class ConfigPath(argparse.Action):
    """The ``config`` argument of a tool: where :func:`find_config` finds it, or as given (the
    tool's first read of it, :func:`mmrepa.apis.load_config`, then names the closest)."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            values = find_config(values)
        except FileNotFoundError:
            pass
        setattr(namespace, self.dest, values)


def tool_argument_parser(description: str, distributed: bool = True) -> argparse.ArgumentParser:
    """A parser with the arguments the runner tools share: ``config`` (the first positional;
    add the tool's own after it), ``--work-dir``, ``--cfg-options`` and, if ``distributed``,
    ``--launcher`` and ``--local_rank``. Apply them with :func:`tool_config`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', action=ConfigPath, help='config file')
    parser.add_argument(
        '--work-dir',
        help='where logs (and checkpoints) go; default: the '
        "config's work_dir, else ./work_dirs/CONFIG_NAME",
    )
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. model.backbone.idle_ratio=0.5 '
        'train_dataloader.batch_size=8',
    )
    parser.add_argument(
        '--data-root',
        metavar='DIR',
        help="use the data in DIR: COCO-format annotations (mmdet), ADE20K's "
        'layout (mmseg), a folder per class (mmpretrain); the classes come from '
        "the data and every head's num_classes follows (see mmrepa/datasets/own_data/)",
    )
    parser.add_argument(
        '--classes',
        type=lambda s: s.split(','),
        metavar='A,B,C',
        help='with --data-root: the class names of segmentation label maps '
        '(else DIR/classes.txt); for COCO data, the categories to keep',
    )
    if distributed:
        parser.add_argument(
            '--launcher',
            choices=['none', 'pytorch', 'slurm', 'mpi'],
            default='none',
            help='job launcher for distributed runs',
        )
        # torch.distributed.launch passes --local-rank (older: --local_rank)
        parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def tool_config(args: argparse.Namespace) -> Config:
    """The config of :func:`tool_argument_parser`'s arguments: :func:`mmrepa.apis.load_config` with
    ``--cfg-options``, ``work_dir`` (``--work-dir``, else the config's, else
    ``./work_dirs/CONFIG_NAME``), ``launcher`` and, after ``--cfg-options``, ``--data-root``
    (:func:`mmrepa.datasets.own_data.use_own_data`). Builds nothing and starts no
    process group
    (call :func:`setup_cpu_distributed` when the tool is ready to)."""
    cfg = load_config(args.config, args.cfg_options)
    if getattr(args, 'data_root', None):
        from ...datasets.own_data import use_own_data

        print(use_own_data(cfg, args.data_root, args.classes), flush=True)
    elif getattr(args, 'classes', None):
        raise ConfigError('--classes goes with --data-root')
    cfg.work_dir = (
        args.work_dir
        or cfg.get('work_dir')
        or osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    )
    if hasattr(args, 'launcher'):
        cfg.launcher = args.launcher
        os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return cfg


def tool_message(tool: str, err: BaseException) -> str:
    """``err``'s message as a tool prints it: ``TOOL: message`` (not twice if the message
    already starts with it: the checks that take the tool's name, such as
    :func:`mmrepa.config.inputs.check_inputs`, put it there)."""
    message = str(err) or type(err).__name__
    return message if message.startswith(f'{tool}: ') else f'{tool}: {message}'


@contextlib.contextmanager
def one_line_errors(tool: str):
    """Stop a tool with one line (one per problem, when the error lists several) and exit
    status 1, no traceback, on the errors whose message already names the file, option or key
    and the fix: every :class:`~mmrepa.errors.MMRepaError` (a config that cannot work, an
    unusable checkpoint, a model that cannot be folded, an input or command-line value the tool
    cannot use, a missing optional package) and a missing file. Usable as a decorator of a
    tool's ``main``.

    This is where mmrepa's errors become an exit status: the library raises them and never
    ``SystemExit`` (see :mod:`mmrepa.errors`). On entry, the objects the tool's imports made are
    frozen (:func:`~mmrepa.integrations.cli.runner.freeze_loaded_objects`): every tool's main
    passes here."""
    freeze_loaded_objects()
    try:
        yield
    except (FileNotFoundError, MMRepaError) as err:
        raise SystemExit(tool_message(tool, err)) from None
