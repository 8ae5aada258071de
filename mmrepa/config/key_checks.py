"""Every key of the config's loops, data loaders, optimizer, schedulers, hooks and evaluators
checked against the arguments of what it configures, before the Runner prints anything.

mmengine's Runner builds these only when it trains or tests, after it has written the
environment and the whole config (~580 lines): ``train_cfg.max_epoch=1`` surfaced at the end of
that, as ``TypeError: EpochBasedTrainLoop.__init__() got an unexpected keyword argument``.
:func:`check_keys` (from :func:`mmrepa.apis.load_config`) refuses such a key in one line with
the closest accepted name. It follows how the Runner turns each part into constructor arguments
(``build_train_loop``, ``build_dataloader``, ``build_optim_wrapper``, ``build_param_scheduler``,
``register_hooks``, ``build_evaluator``) and resolves each ``type`` as the Runner does, in the
config's ``default_scope``. A class whose ``**kwargs`` go anywhere but the next ``__init__`` of
its MRO accepts every key; a type that does not resolve is left to the Runner's own error.
mmdet's, mmseg's and mmpretrain's own tools meet the key inside their Runner; there
:func:`~mmrepa.config.checks.explain` names it the same way, at the end.
"""

import ast
import difflib
import functools
import importlib
import inspect
import textwrap
from typing import Callable, FrozenSet, Iterator, List, NamedTuple, Optional, Tuple

from mmengine.config import Config

from ..errors import ConfigError
from .checks import config_scope

TYPED = frozenset({'type', '_scope_'})
# what the Runner builds the loops with itself
RUNNER_FILLS = frozenset({'runner', 'dataloader', 'evaluator'})
# the data loader keys mmengine's build_dataloader takes out before it calls torch's DataLoader
LOADER_KEYS = frozenset({'num_batch_per_epoch', 'disable_subprocess_warning'})
SCHEDULER_KEYS = TYPED | {'convert_to_iter_based', 'epoch_length'}  # build_scheduler_from_cfg
WRAPPER_KEYS = TYPED | {'optimizer', 'constructor', 'paramwise_cfg'}  # build_optim_wrapper
OPTIMIZER = frozenset({'optimizer'})  # given to wrappers and schedulers


class Site(NamedTuple):
    """A config dict the Runner turns into arguments of ``target`` (a class or function, or
    the name of the registry its ``type`` is found in), besides its keys ``own`` (what the
    Runner or the registry takes out of it); ``fills``: arguments the Runner gives itself."""

    key: str
    node: object
    target: object
    scope: str
    own: FrozenSet[str] = TYPED
    fills: FrozenSet[str] = frozenset()


# ------------------------------------------------------------ what a class or function accepts


def _kwargs_targets() -> dict:
    """Classes that keep their ``**kwargs`` for a later call: the functions that get them."""
    from mmengine.hooks import CheckpointHook
    from mmengine.runner import FlexibleRunner, Runner

    return {CheckpointHook: (Runner.save_checkpoint, FlexibleRunner.save_checkpoint)}


def _parameters(fn: Callable, skip_first: bool) -> Tuple[Optional[FrozenSet[str]], str]:
    """The keyword-passable parameter names of ``fn`` (``None`` if it has no signature), and the
    name of its ``**kwargs`` (``''`` if none)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[int(skip_first) :]
    except (TypeError, ValueError):
        return None, ''
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = frozenset(p.name for p in params if p.kind in kinds)
    var = [p.name for p in params if p.kind == inspect.Parameter.VAR_KEYWORD]
    return names, var[0] if var else ''


def _literal_read(name: ast.Name, parents: dict) -> Optional[str]:
    """``'k'`` where ``name`` is read as ``kwargs.pop('k')`` (``get``, ``setdefault``),
    ``kwargs['k']`` or ``'k' in kwargs``."""
    parent = parents.get(name)
    call = parents.get(parent)
    if isinstance(parent, ast.Attribute) and parent.attr in ('pop', 'get', 'setdefault'):
        args = call.args if isinstance(call, ast.Call) and call.func is parent else []
        literal = args[0] if args else None
    elif isinstance(parent, ast.Subscript) and parent.value is name:
        literal = parent.slice
    elif isinstance(parent, ast.Compare) and parent.comparators == [name]:
        literal = parent.left
    else:
        return None
    value = getattr(literal, 'value', None)
    return value if isinstance(literal, ast.Constant) and isinstance(value, str) else None


def _hands_on(name: ast.Name, parents: dict) -> bool:
    """``name`` is the ``**kwargs`` of a call to an ``__init__`` (``super().__init__``)."""
    func = getattr(parents.get(parents[name]), 'func', None)
    return isinstance(parents[name], ast.keyword) and getattr(func, 'attr', '') == '__init__'


def _extends_itself(name: ast.Name, parents: dict) -> bool:
    """``name`` is in ``kwargs = {'k': v, **kwargs}`` (defaults for the keys handed on)."""
    assign = parents[name]
    if isinstance(assign, ast.Dict):
        assign = parents.get(assign)
    if not (isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Dict)):
        return False
    value = assign.value
    spread = [v for k, v in zip(value.keys, value.values) if k is None]
    targets = [t for t in assign.targets if isinstance(t, ast.Name)]
    return [t.id for t in targets] == [name.id] and any(
        isinstance(v, ast.Name) and v.id == name.id for v in spread
    )


def _forwarded_kwargs(init: Callable, var: str) -> Optional[FrozenSet[str]]:
    """The keys ``init`` reads from its ``**var`` when it hands the others on to the next
    ``__init__`` (``super().__init__(**kwargs)``), or ``None``: they go where we cannot follow
    (kept, passed elsewhere, ignored, or no source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return None
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    read, forwarded = set(), False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == var):
            continue
        if _hands_on(node, parents):
            forwarded = True
        elif not _extends_itself(node, parents):
            key = _literal_read(node, parents)
            if key is None:
                return None
            read.add(key)
    return frozenset(read) if forwarded else None


@functools.lru_cache(maxsize=None)
def accepted_keys(target: Callable) -> Optional[FrozenSet[str]]:
    """The argument names ``target`` (a class: its ``__init__``s along the MRO, as far as
    ``**kwargs`` are handed on; a function: its own) accepts, or ``None`` for any."""
    if not isinstance(target, type):
        names, var = _parameters(target, skip_first=False)
        return None if var else names
    accepted = frozenset()
    for klass in target.__mro__[:-1]:  # object's __init__ takes no keys
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        names, var = _parameters(init, skip_first=True)
        if names is None:
            return None
        accepted |= names
        if not var:
            return accepted
        later = _kwargs_targets().get(klass)
        if later:  # the keys those calls take (they take no **kwargs themselves)
            return accepted.union(*(_parameters(f, skip_first=True)[0] for f in later))
        read = _forwarded_kwargs(init, var)
        if read is None:
            return None
        accepted |= read
    return accepted


# ------------------------------------------------------------------- where the Runner uses keys


def _each(key: str, node) -> Iterator[Tuple[str, object]]:
    """``node`` with its key, or each item of a list with its own."""
    if isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield f'{key}.{i}', item
    else:
        yield key, node


def _loop_sites(cfg: Config, scope: str) -> Iterator[Site]:
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop

    for part, default in (('train_cfg', None), ('val_cfg', ValLoop), ('test_cfg', TestLoop)):
        loop = cfg.get(part)
        if not isinstance(loop, dict):
            continue
        if 'type' in loop:
            yield Site(part, loop, 'LOOPS', scope, TYPED, RUNNER_FILLS)
        elif default is not None:
            yield Site(part, loop, default, scope, frozenset(), RUNNER_FILLS)
        elif 'by_epoch' in loop:  # Runner.build_train_loop's form without a type
            by_epoch = EpochBasedTrainLoop if loop['by_epoch'] else IterBasedTrainLoop
            yield Site(part, loop, by_epoch, scope, frozenset({'by_epoch'}), RUNNER_FILLS)


def _dataset_sites(key: str, dataset, scope: str) -> Iterator[Site]:
    """A data set and those it wraps (``RepeatDataset``'s ``dataset``, ``ConcatDataset``'s
    ``datasets``), built in the wrapper's scope."""
    if not isinstance(dataset, dict):
        return
    yield Site(key, dataset, 'DATASETS', scope)
    scope = dataset.get('_scope_') or scope
    yield from _dataset_sites(f'{key}.dataset', dataset.get('dataset'), scope)
    for inner_key, inner in _each(f'{key}.datasets', dataset.get('datasets') or []):
        yield from _dataset_sites(inner_key, inner, scope)


def _loader_sites(cfg: Config, scope: str) -> Iterator[Site]:
    from torch.utils.data import DataLoader

    for part in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(part)
        if not isinstance(loader, dict):
            continue
        yield Site(part, loader, DataLoader, scope, LOADER_KEYS)
        yield from _dataset_sites(f'{part}.dataset', loader.get('dataset'), scope)
        samplers = dict(sampler=('dataset', 'seed'), batch_sampler=('sampler', 'batch_size'))
        for name, fills in samplers.items():
            yield Site(
                f'{part}.{name}', loader.get(name), 'DATA_SAMPLERS', scope, TYPED, frozenset(fills)
            )
        for name in ('collate_fn', 'worker_init_fn'):  # functions, called with the rest
            yield Site(f'{part}.{name}', loader.get(name), 'FUNCTIONS', scope, frozenset({'type'}))


def _optim_sites(cfg: Config, scope: str) -> Iterator[Site]:
    """The optimizer and its wrapper, as mmengine's DefaultOptimWrapperConstructor (and those
    derived from it) builds them; other constructors may read the keys as they like."""
    from mmengine.optim import DefaultOptimWrapperConstructor

    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, dict) or not isinstance(wrapper.get('optimizer'), dict):
        return
    name = wrapper.get('constructor', 'DefaultOptimWrapperConstructor')
    constructor = _resolve('OPTIM_WRAPPER_CONSTRUCTORS', name, scope)
    if not (
        isinstance(constructor, type) and issubclass(constructor, DefaultOptimWrapperConstructor)
    ):
        return
    optimizer = wrapper['optimizer']
    yield Site(
        'optim_wrapper.optimizer', optimizer, 'OPTIMIZERS', scope, TYPED, frozenset({'params'})
    )
    wrapper = {'type': 'OptimWrapper', **wrapper}
    yield Site('optim_wrapper', wrapper, 'OPTIM_WRAPPERS', scope, WRAPPER_KEYS, OPTIMIZER)


def _scheduler_sites(cfg: Config, scope: str) -> Iterator[Site]:
    schedulers = cfg.get('param_scheduler')
    if isinstance(schedulers, dict) and 'type' not in schedulers:  # a list per optimizer
        parts = [(f'param_scheduler.{name}', s) for name, s in schedulers.items()]
    else:
        parts = [('param_scheduler', schedulers)]
    for part, scheduler in parts:
        for key, node in _each(part, scheduler):
            yield Site(key, node, 'PARAM_SCHEDULERS', scope, SCHEDULER_KEYS, OPTIMIZER)


def _hook_sites(cfg: Config, scope: str) -> Iterator[Site]:
    own = TYPED | {'priority'}  # Runner.register_hook takes it out
    hooks = cfg.get('default_hooks')
    for name, hook in (hooks or {}).items() if isinstance(hooks, dict) else ():
        yield Site(f'default_hooks.{name}', hook, 'HOOKS', scope, own)
    for key, hook in _each('custom_hooks', cfg.get('custom_hooks') or []):
        yield Site(key, hook, 'HOOKS', scope, own)


def _evaluator_sites(cfg: Config, scope: str) -> Iterator[Site]:
    """An evaluator with ``metrics`` (built by EVALUATOR), else a metric or a list of them."""
    for part in ('val_evaluator', 'test_evaluator'):
        metrics = cfg.get(part)
        if isinstance(metrics, dict) and 'metrics' in metrics:
            yield Site(part, {'type': 'Evaluator', **metrics}, 'EVALUATOR', scope)
            part, scope_here = f'{part}.metrics', metrics.get('_scope_') or scope
            metrics = metrics['metrics']
        else:
            scope_here = scope
        for key, metric in _each(part, metrics):
            yield Site(key, metric, 'METRICS', scope_here)


SITES = (_loop_sites, _loader_sites, _optim_sites, _scheduler_sites, _hook_sites, _evaluator_sites)


# ------------------------------------------------------------------------------------ the check


def _resolve(registry: str, name, scope: str) -> Optional[Callable]:
    """What the Runner builds for ``type=name`` from mmengine's registry ``registry`` in
    ``scope`` (the root registry where the scope has none, as mmengine's build does, without
    its warning), or ``None`` if it does not resolve."""
    import mmengine.registry

    if callable(name):  # a class or function given as the type (a Python-style config)
        return name
    if not isinstance(name, str):
        return None
    try:
        found = getattr(importlib.import_module(f'{scope}.registry'), registry, None)
        if not isinstance(found, mmengine.registry.Registry):
            found = getattr(mmengine.registry, registry)
        return found.get(name)
    except Exception:  # noqa: BLE001  a scope or dotted name that does not import
        return None


def _refusals(site: Site) -> List[str]:
    """One line per key of ``site.node`` that its target does not accept."""
    node = site.node
    if not isinstance(node, dict):
        return []
    target = site.target
    if isinstance(target, str):
        target = _resolve(target, node.get('type'), node.get('_scope_') or site.scope)
    accepted = accepted_keys(target) if target is not None else None
    if accepted is None:
        return []
    accepted |= site.own
    offered = sorted(accepted - site.fills - {'_scope_'})
    lines = []
    for key in (k for k in node if k not in accepted):
        close = difflib.get_close_matches(str(key), offered, n=1, cutoff=0.6)
        hint = f'did you mean {close[0]!r}?' if close else f'it takes {", ".join(offered)}'
        name = getattr(target, '__name__', repr(target))
        lines.append(f'{site.key}.{key}: {name} takes no argument {key!r}: {hint}')
    return lines


def key_problems(cfg: Config) -> List[str]:
    """One line per key of a loop, data loader, data set, sampler, optimizer (and wrapper),
    scheduler, hook or evaluator of ``cfg`` that what it configures does not accept."""
    scope = config_scope(cfg)
    return [line for sites in SITES for site in sites(cfg, scope) for line in _refusals(site)]


def check_keys(cfg: Config) -> None:
    """Raise :class:`ConfigError`, one line per unaccepted key (see :func:`key_problems`)."""
    problems = key_problems(cfg)
    if problems:
        raise ConfigError('\n'.join(problems))
