"""The library does not import its command-line package: only ``mmrepa/integrations/cli`` itself
(and ``tools/``, ``tests/``) may import ``mmrepa.integrations.cli`` (docs/layout.md). And no
function of the repository's Python is longer than one screen (80 lines; ruff holds complexity
and statement counts, ruff.toml)."""

import ast
import os
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PACKAGE = osp.join(ROOT, 'mmrepa')
CLI = 'mmrepa.integrations.cli'


def _module_name(path: str) -> str:
    rel = osp.relpath(path, osp.dirname(PACKAGE))[: -len('.py')]
    return rel.replace(os.sep, '.').removesuffix('.__init__')


def imported_names(source: str, module: str, is_package: bool):
    """Every absolute module name ``source`` (the module ``module``) imports, wherever the import
    stands (top level, function, class, ``try``): ``import a.b``, ``from a import b`` (as
    ``a`` and ``a.b``), relative imports resolved, and ``importlib.import_module('a.b')``."""
    package = module.split('.') if is_package else module.split('.')[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = '.'.join(base + ([node.module] if node.module else []))
            yield target
            yield from (f'{target}.{alias.name}' for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, 'attr', getattr(node.func, 'id', '')) == 'import_module'
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def _imports_cli(names) -> bool:
    return any(n == CLI or n.startswith(CLI + '.') for n in names)


def test_the_library_does_not_import_the_cli():
    offenders = []
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(f for f in files if f.endswith('.py')):
            path = osp.join(folder, name)
            module = _module_name(path)
            if module == CLI or module.startswith(CLI + '.'):
                continue
            with open(path, encoding='utf-8') as f:
                names = list(imported_names(f.read(), module, name == '__init__.py'))
            offenders += [f'{module} imports {n}' for n in names if _imports_cli([n])]
    assert offenders == [], '\n'.join(offenders)


def test_every_import_form_is_seen():
    """The parser itself: each way a library module could reach the CLI is found."""
    forms = {
        'import mmrepa.integrations.cli.args': ('mmrepa.engine.x', False),
        'from mmrepa.integrations.cli import args': ('mmrepa.engine.x', False),
        'from .integrations.cli.args import one_line_errors': ('mmrepa.seams', False),
        'from ..integrations import cli': ('mmrepa.config.checks', False),
        'from ...integrations.cli.outputs import check_outputs': ('mmrepa.datasets.own_data', True),
        'def f():\n    from .cli import args': ('mmrepa.integrations.onnx', False),
        "import importlib\nimportlib.import_module('mmrepa.integrations.cli.args')": (
            'mmrepa.x',
            False,
        ),
    }
    for source, (module, is_package) in forms.items():
        assert _imports_cli(imported_names(source, module, is_package)), source
    assert not _imports_cli(imported_names('from .integrations import onnx', 'mmrepa.x', False))


def long_functions(source: str, limit: int = 80):
    """``(name, first line, lines)`` of every function of ``source`` longer than ``limit``
    lines, decorators and docstring included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if node.end_lineno - first + 1 > limit:
                yield node.name, first, node.end_lineno - first + 1


def test_no_function_is_longer_than_80_lines():
    found = []
    for top in ('mmrepa', 'tools', 'benchmarks', 'tests', 'configs'):
        for dirpath, dirnames, filenames in os.walk(osp.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ('.mim', '__pycache__')]
            for name in filenames:
                if name.endswith('.py'):
                    path = osp.join(dirpath, name)
                    with open(path, encoding='utf-8') as f:
                        found += [
                            f'{osp.relpath(path, ROOT)}:{line} {fn} ({n} lines)'
                            for fn, line, n in long_functions(f.read())
                        ]
    assert not found, found


def test_long_functions_are_measured_from_the_decorator():
    body = '\n'.join(f'    x = {i}' for i in range(79))
    assert not list(long_functions(f'def f():\n{body}\n'))  # 80 lines
    assert [n for _, _, n in long_functions(f'@property\ndef f():\n{body}\n')] == [81]
