"""One error hierarchy (issue 23, point 4): every mistake mmrepa reports is an MMRepaError, every
tool prints any of them as one line with exit status 1, and library code never exits.

The tools run in this process (``run_script_here``) up to their error; nothing is trained.
"""

import ast
import importlib
import inspect
import os
import os.path as osp
import pkgutil

import pytest

import mmrepa
import mmrepa.errors as errors
from mmrepa.config.explain import explain
from mmrepa.integrations.cli.args import one_line_errors
from tests.helpers import ROOT, run_script_here

PACKAGE = osp.join(ROOT, 'mmrepa')
TOOL = 'tools/x.py'

# the built-in exception each kind also is, so that ``except ValueError`` and the like written
# before the hierarchy keep catching what they caught
BUILTIN = {
    errors.ConfigError: ValueError,
    errors.ConfigTypeError: TypeError,
    errors.CheckpointError: ValueError,
    errors.MissingKeysError: KeyError,
    errors.FoldError: RuntimeError,
    errors.InputError: ValueError,
    errors.DependencyError: ImportError,
}


def error_classes(module):
    """The errors ``module`` defines (an ``Exception``; a ``BaseException`` such as
    ``mmrepa.utils.files._Terminated`` carries a signal through ``finally`` blocks, no mistake)."""
    return [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, Exception) and c.__module__ == module.__name__
    ]


def test_every_error_of_mmrepa_errors_is_an_mmrepa_error_and_its_old_builtin():
    classes = error_classes(errors)
    assert set(classes) == set(BUILTIN) | {errors.MMRepaError}, classes
    for cls in classes:
        assert issubclass(cls, errors.MMRepaError), cls
    for cls, builtin in BUILTIN.items():
        assert issubclass(cls, builtin), (cls, builtin)
    # FoldError lives in mmrepa.errors; the old import paths give the same class
    from mmrepa.fold import FoldError
    from mmrepa.fold.protocol import FoldError as ProtocolFoldError

    assert FoldError is ProtocolFoldError is mmrepa.FoldError is errors.FoldError


def test_every_error_class_defined_in_mmrepa_is_an_mmrepa_error():
    """Exception classes defined anywhere in the package derive from the base too (the
    checkpoint loader's refusals, the quantizer's calibration mismatch, ...)."""
    found = []
    for info in pkgutil.walk_packages(mmrepa.__path__, 'mmrepa.'):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (mmdeploy, ...) not installed
            continue
        found += error_classes(module)
    assert len(found) > len(BUILTIN), found  # the scan sees more than mmrepa.errors
    assert [c for c in found if not issubclass(c, errors.MMRepaError)] == []


@pytest.mark.parametrize('kind', sorted(BUILTIN, key=lambda c: c.__name__) + [errors.MMRepaError])
def test_a_tool_prints_each_kind_as_one_line_with_status_1(kind):
    message = 'model.backbone.idle_ratio=1.5: idle_ratio must be in [0, 1]; set 0.75'

    @one_line_errors(TOOL)
    def main():
        raise kind(message)

    with pytest.raises(SystemExit) as stop:
        main()
    # a string code: the interpreter prints it on stderr and exits with status 1
    assert stop.value.code == f'{TOOL}: {message}'
    assert stop.value.__suppress_context__  # no "during handling" traceback either
    # mmdet's own tools (mim train mmdet CONFIG) get the same one line from the excepthook
    line = explain(kind(message))
    assert line.endswith(f'Error: {message}') and '\n' not in line, line


def test_one_line_errors_names_the_tool_once_and_keeps_bugs_as_tracebacks():
    @one_line_errors(TOOL)
    def main(err):
        raise err

    # messages of the checks that take the tool's name already start with it
    with pytest.raises(SystemExit) as stop:
        main(errors.InputError(f'{TOOL}: cannot read image a.png: no such file'))
    assert stop.value.code == f'{TOOL}: cannot read image a.png: no such file'
    with pytest.raises(SystemExit) as stop:
        main(FileNotFoundError(2, 'No such file or directory', 'a.pth'))
    assert stop.value.code.startswith(f'{TOOL}: ') and "'a.pth'" in stop.value.code
    # a bug (not an MMRepaError) keeps its type and traceback, even if it is a ValueError
    for bug in (ValueError('internal'), RuntimeError('internal'), KeyError('internal')):
        with pytest.raises(type(bug)):
            main(bug)


# ---------------------------------------------------------------- library code never exits

# where a SystemExit is right: (file under mmrepa/, enclosing function) -> why
EXIT_POINT = ('integrations/cli/args.py', 'one_line_errors')
ALLOWED_EXITS = {EXIT_POINT: "the tools' exit point: an MMRepaError becomes the exit status there"}


def _exits(tree):
    """(line, enclosing function, code) of every ``raise SystemExit`` and every call of
    ``sys.exit``, ``os._exit`` or the built-in ``exit`` / ``quit`` (not a parameter of that
    name: mmrepa/integrations/mmdeploy/rewriters.py wraps a method called ``exit``)."""
    found = []

    def visit(node, function, params=frozenset()):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            function = getattr(node, 'name', function)
            args = node.args
            params = params | {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        hit = None
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == 'SystemExit':
                hit = 'raise SystemExit'
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and ((func.value.id, func.attr) in (('sys', 'exit'), ('os', '_exit')))
            ):
                hit = f'{func.value.id}.{func.attr}('
            elif (
                isinstance(func, ast.Name)
                and func.id in ('exit', 'quit')
                and (func.id not in params)
            ):
                hit = f'{func.id}('
        if hit:
            found.append((node.lineno, function, hit))
        for child in ast.iter_child_nodes(node):
            visit(child, function, params)

    visit(tree, None)
    return found


def test_no_library_code_exits():
    """A library raises; only a tool decides that an error ends the process (tools/ may exit,
    mmrepa/ may not, but for the places in ALLOWED_EXITS)."""
    offenders, allowed_seen = [], set()
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if not name.endswith('.py'):
                continue
            path = osp.join(folder, name)
            rel = osp.relpath(path, PACKAGE).replace(os.sep, '/')
            with open(path, encoding='utf-8') as f:
                tree = ast.parse(f.read(), path)
            for line, function, what in _exits(tree):
                if (rel, function) in ALLOWED_EXITS:
                    allowed_seen.add((rel, function))
                else:
                    offenders.append(f'mmrepa/{rel}:{line} ({function}): {what}')
    assert offenders == [], 'raise an mmrepa.errors exception instead:\n' + '\n'.join(offenders)
    assert EXIT_POINT in allowed_seen  # the scan sees what it looks for


# ------------------------------------------------ configuration mistakes through a tool

DEMO = osp.join(ROOT, 'configs', 'demo')


@pytest.mark.parametrize(
    'config, options, expected',
    [
        # the backbones' own options
        (
            'demo/retinanet_repa_swin_shapes.py',
            ['model.backbone.idle_ratio=1.5'],
            'idle_ratio must be in [0, 1]',
        ),
        (
            'demo/retinanet_repa_swin_shapes.py',
            ['model.backbone.window_size=0'],
            'window_size must be an integer >= 1, got 0',
        ),
        (
            'demo/retinanet_repa_swin_shapes.py',
            ['model.backbone.patch_norm_typo=True'],
            "RePaSwin got unexpected arguments ['patch_norm_typo']",
        ),
        (
            'demo/classifier_depthrep_vit_shapes.py',
            ['model.backbone.depth=5'],
            'depth=5 does not divide',
        ),
        (
            'demo/retinanet_repa_caformer_shapes.py',
            ['model.backbone.out_indices=(1,2,7)'],
            'out_indices (1, 2, 7)',
        ),
        # a neck and a head
        (
            'depth_rep_vit/retinanet_depthrep_vit_tiny_d6_1x_coco.py',
            ['model.neck.scale_factors=(3.0,)'],
            'SimpleFPN scale_factors (3.0,): [3.0] not supported',
        ),
        (
            'metaformer/convformer_s18_32xb128_in1k.py',
            ['model.head.num_classes=0'],
            'num_classes must be positive, got 0',
        ),
    ],
)
def test_a_configuration_mistake_prints_one_line_through_a_tool(config, options, expected):
    """tools/get_flops.py builds the model without checking it first: the modules' own errors
    reach the tool as they are."""
    _, log = run_script_here(
        'tools/get_flops.py',
        osp.join(ROOT, 'configs', config),
        '--shape',
        '64',
        '64',
        '--cfg-options',
        *options,
        ok=False,
    )
    lines = log.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('tools/get_flops.py: '), log[-3000:]
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize(
    'options, expected',
    [
        (['--repeat', '0', '--warmup', '0'], 'repeat must be >= 1, got 0'),
        (['--shape', '2', '2'], 'is too small'),
    ],
)
def test_a_bad_command_line_value_prints_one_line_through_a_tool(options, expected):
    _, log = run_script_here(
        'tools/benchmark.py',
        osp.join(DEMO, 'retinanet_repa_swin_shapes.py'),
        '--device',
        'cpu',
        '--backbone-only',
        *options,
        ok=False,
    )
    lines = log.strip().splitlines()
    assert lines[-1].startswith('tools/benchmark.py: ') and 'Traceback' not in log, log[-3000:]
    assert expected in lines[-1], lines[-1]
