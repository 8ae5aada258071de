"""What ``import mmrepa`` changes outside mmrepa (mmrepa/seams.py lists it), and the boundaries
between the model package, the engine and the tools' glue."""

import ast
import json
import os
import os.path as osp
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PACKAGE = osp.join(ROOT, 'mmrepa')
# the model side: what a config's model is built from; none of it needs the runner's hooks,
# the tools' glue or the package root (which imports the engine)
MODEL_SIDE = ('backbones', 'layers', 'necks', 'heads', 'classifiers', 'fold', 'checkpoint')
NOT_FROM_MODELS = ('mmrepa.engine', 'mmrepa.integrations', 'mmrepa.apis')
# the one rule for optional packages (timm's checkpoint conversions use it): it imports only
# importlib and mmrepa.errors, and integrations/__init__.py imports nothing
OPTIONAL_RULE = 'mmrepa.integrations.optional'


def run(code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_import_mmrepa_makes_exactly_the_listed_changes():
    found = run(
        'import sys, warnings, json, torch\n'
        'hook_before = sys.excepthook is sys.__excepthook__\n'
        'import mmrepa\n'
        'import mmrepa.one_line_errors\n'  # the tools' opt-in: the hook and the filter
        'from mmengine.runner.checkpoint import CheckpointLoader\n'
        'from mmrepa.checkpoint.stand_ins import MMENGINE_GLOBALS\n'
        'print(json.dumps(dict(\n'
        '    hook=hook_before and sys.excepthook is not sys.__excepthook__,\n'
        '    schemes=sorted({l.__module__ for l in CheckpointLoader._schemes.values()}),\n'
        '    allowed=all(g in torch.serialization.get_safe_globals() for g in MMENGINE_GLOBALS),\n'
        '    filtered=any(f[1] and f[1].pattern.startswith("pkg_resources is deprecated")\n'
        '                 for f in warnings.filters),\n'
        '    tools=sorted(m for m in sys.modules if m.startswith("mmrepa.integrations")\n'
        '                 or m == "mmrepa.apis"))))\n'
    )
    assert found['hook'], 'the opt-in mmrepa.one_line_errors installs the one-line excepthook'
    assert found['schemes'] == ['mmrepa.checkpoint.schemes'], found['schemes']
    assert found['allowed'] and found['filtered']
    assert found['tools'] == [], 'import mmrepa imports none of the tools glue'


def test_an_excepthook_someone_else_installed_is_left_alone():
    found = run(
        'import sys, json\n'
        'def mine(*args): pass\n'
        'sys.excepthook = mine\n'
        'import mmrepa.one_line_errors\n'  # the opt-in that installs the hook over the default
        'print(json.dumps(sys.excepthook is mine))\n'
    )
    assert found is True


def _imported_modules(path: str, module: str):
    """The absolute names of the modules ``path`` (the module ``module``) imports."""
    package = module if path.endswith('__init__.py') else module.rsplit('.', 1)[0]
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split('.')
            base = base[: len(base) - node.level + 1] if node.level else []
            target = '.'.join(base + ([node.module] if node.module else []))
            if node.module:
                yield target
            yield from (f'{target}.{a.name}' for a in node.names)


def test_model_modules_import_neither_the_engine_nor_the_tools_glue():
    """A model module that imported ``mmrepa`` (the root) would pull in the runner's hooks."""
    offenders = []
    for part in MODEL_SIDE:
        for folder, _, files in os.walk(osp.join(PACKAGE, part)):
            for name in sorted(f for f in files if f.endswith('.py')):
                path = osp.join(folder, name)
                rel = osp.relpath(path, osp.dirname(PACKAGE))[: -len('.py')]
                module = rel.replace(os.sep, '.').removesuffix('.__init__')
                for target in _imported_modules(path, module):
                    if target.startswith(OPTIONAL_RULE):
                        continue
                    if target == 'mmrepa' or target.startswith(NOT_FROM_MODELS):
                        offenders.append(f'{rel}.py imports {target}')
    assert offenders == [], '\n'.join(offenders)
