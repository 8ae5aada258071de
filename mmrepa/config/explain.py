"""The last resort, in other projects' tools: the one-line account of an uncaught error whose
cause is known.

mmdet's, mmseg's and mmpretrain's own tools (``mim train mmdet CONFIG``) build our backbones
inside their Runner, after its print-out; there the excepthook of :mod:`mmrepa.seams` (installed
by mmrepa's tools and by the opt-in :mod:`mmrepa.one_line_errors`) prints what :func:`explain`
finds, found by the checks our own tools run first.
"""

import importlib
import re
import traceback
from typing import List, Optional

from mmengine.config import Config
from mmengine.registry import Registry

from ..errors import ConfigError, MMRepaError
from .checks import build_backbone, did_you_mean, unknown_types

_REGISTRY_KEY_ERROR = re.compile(r'(\S+) is not in the (\w+)::(\w+) registry')
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
TRACEBACK_HINT = '(mmrepa shortened this error; MMREPA_TRACEBACK=1 shows the traceback)'


def _runner_config(tb) -> Optional[Config]:
    """The config of the mmengine Runner whose method raised, if one did."""
    from mmengine.runner import Runner

    for frame, _ in traceback.walk_tb(tb):
        runner = frame.f_locals.get('self')
        if isinstance(runner, Runner) and isinstance(getattr(runner, 'cfg', None), Config):
            return runner.cfg
    return None


def _data_problems(err: BaseException, cfg: Config) -> List[str]:
    """The data problems of ``cfg`` that caused ``err``: missing files the error names, or a
    class filter that left a data set empty (mmdet: "need at least one array to
    concatenate")."""
    from .inputs import class_filter_problems, find_missing_inputs

    splits = ('train', 'val', 'test')
    if isinstance(err, FileNotFoundError):
        missing = find_missing_inputs(cfg, splits=splits, pretrained=True)
        return [str(m) for m in missing if m.path in str(err)]
    if isinstance(err, ValueError) and 'need at least one array' in str(err):
        return class_filter_problems(cfg, splits)
    return []


def _key_problems(err: BaseException, cfg: Config) -> List[str]:
    """The key of ``cfg`` behind "got an unexpected keyword argument 'k'" from a loop, data
    loader, optimizer, scheduler, hook or evaluator the Runner built (see :mod:`.key_checks`)."""
    from .key_checks import key_problems

    match = _UNEXPECTED_KEYWORD.search(str(err)) if isinstance(err, TypeError) else None
    if not match:
        return []
    return [line for line in key_problems(cfg) if f'no argument {match.group(1)!r}' in line]


def _in_context(err: ConfigError, cfg: Optional[Config]) -> str:
    """``err``'s message as our tools give it (``model.backbone (RePaSwin): ...``) if building
    the config's backbone alone raises it, else as it is."""
    try:
        if cfg is not None:
            build_backbone(cfg)
    except ConfigError as found:
        if str(err) in str(found):
            return str(found)
    return str(err)


def _unregistered(message: str, cfg: Optional[Config]) -> Optional[str]:
    """mmengine's "X is not in the scope::kind registry" with the option and "did you mean"."""
    match = _REGISTRY_KEY_ERROR.match(message)
    if not match:
        return None
    name, scope, kind = match.groups()
    lines = [line for line in unknown_types(cfg) if f'={name!r}' in line] if cfg else []
    if lines:  # a model type: the line names the option
        return '\n'.join(lines)
    registries = [
        r
        for r in vars(importlib.import_module(f'{scope}.registry')).values()
        if isinstance(r, Registry) and r.scope == scope and r.name == kind
    ]
    hint = did_you_mean(name, registries) or 'is its package in custom_imports?'
    return f'{name!r} is not registered in the {scope} {kind} registry: {hint}'


def explain(err: BaseException, tb=None) -> Optional[str]:
    """The one-line (or one line per problem) account of an uncaught error whose cause is
    known, or ``None``: mmrepa's own errors (their messages name the option and the fix), an
    unregistered type (with "did you mean"), and, raised inside a Runner, a missing data file,
    an emptied data set or a key that what it configures does not take (found by the checks
    our tools run first)."""
    cfg = _runner_config(tb) if tb is not None else None
    if isinstance(err, ConfigError):
        return f'ConfigError: {_in_context(err, cfg)}'
    if isinstance(err, MMRepaError):
        return f'{type(err).__name__}: {err}'
    if isinstance(err, KeyError) and err.args:
        return _unregistered(str(err.args[0]), cfg)
    if cfg is None:
        return None
    return '\n'.join(_data_problems(err, cfg) + _key_problems(err, cfg)) or None
