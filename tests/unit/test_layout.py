"""The library does not import its command-line package: only ``mmrepa/integrations/cli`` itself
(and ``tools/``, ``tests/``) may import ``mmrepa.integrations.cli`` (docs/layout.md)."""

import ast
import os
import os.path as osp

PACKAGE = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'mmrepa')
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
