"""The tools' input checks: what a tool will read exists and fits the config
(:mod:`mmrepa.config.inputs` finds the paths), and images named on the command line."""

from mmengine.config import Config

from ...config.checks import check_model
from ...config.inputs import class_filter_problems, find_missing_inputs
from ...errors import ConfigError, InputError


def check_inputs(cfg: Config, tool: str, **kwargs) -> None:
    """:func:`~mmrepa.config.inputs.find_missing_inputs`; if anything is missing, raise with one
    line per path. Then :func:`~mmrepa.config.inputs.class_filter_problems` and
    :func:`mmrepa.config.checks.check_model` (the backbone built alone, ``checkpoints`` loaded
    into it): what the Runner would otherwise find after printing its environment and config.

    Raises :class:`~mmrepa.errors.InputError` naming each missing path (a line each), the
    config key it comes from and the README section that says how to get it;
    :class:`~mmrepa.errors.ConfigError` or :class:`~mmrepa.errors.CheckpointError` (one line per
    problem) for the rest. A tool prints them without traceback
    (:func:`mmrepa.integrations.cli.args.one_line_errors`).
    """
    missing = find_missing_inputs(cfg, **kwargs)
    if missing:
        count = '1 input' if len(missing) == 1 else f'{len(missing)} inputs'
        header = (
            f'{tool}: {count} of {cfg.filename} missing, nothing was built (point to '
            'another path with --cfg-options KEY=PATH):'
        )
        raise InputError('\n'.join([header] + [str(m) for m in missing]))
    problems = class_filter_problems(cfg, kwargs.get('splits', ()))
    if problems:
        raise ConfigError('\n'.join(problems))
    check_model(cfg, kwargs.get('checkpoints', ()))


def read_image(tool: str, path: str):
    """The image file ``path`` as an RGB array. A file that is missing or not an image raises
    :class:`~mmrepa.errors.InputError` naming it, which stops the tool with one line before the
    model is built (cv2 would fail later, deep in the test pipeline, with a traceback)."""
    import mmcv

    try:
        image = mmcv.imread(path)
    except OSError as err:  # missing, a directory, unreadable
        why = 'no such file' if isinstance(err, FileNotFoundError) else err.strerror or err
        raise InputError(f'{tool}: cannot read image {path}: {why}') from None
    if image is None:
        raise InputError(
            f'{tool}: cannot read image {path}: not an image file (cv2/mmcv could not decode it)'
        )
    return mmcv.bgr2rgb(image)
