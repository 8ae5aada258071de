"""setup.py says what each import needs: every third-party module mmrepa/ imports comes from a
distribution setup.py names (install_requires or an extra) or from one of their own
requirements; ``import mmrepa`` loads nothing of an extra; every extra is imported somewhere;
and the tested environment fits setup.py's ranges."""

import ast
import os
import os.path as osp
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import ROOT

# imported by mmrepa/ but deliberately not in setup.py, with why
NOT_IN_SETUP = {
    'mmdeploy': 'its protobuf pin breaks onnx: tools/install_deps.sh installs it with --no-deps',
    'pavi': "mmengine's model cloud client, imported only to read a pavi:// checkpoint",
}
# in an extra but not imported by mmrepa/, with why
NOT_IMPORTED = {
    'ftfy': 'mmseg 1.2.2 imports it without declaring it',
    'regex': 'mmseg 1.2.2 imports it without declaring it',
}


def setup_requirements():
    """(install_requires, extras_require) of setup.py's ``setup()`` call, read, not run."""
    with open(osp.join(ROOT, 'setup.py'), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'setup':
            kwargs = {k.arg: k.value for k in node.keywords}
            return (
                ast.literal_eval(kwargs['install_requires']),
                ast.literal_eval(kwargs['extras_require']),
            )
    raise AssertionError('setup.py has no setup() call')


def names(reqs):
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def closure(dists):
    """``dists`` and everything they require (without extras), as installed here."""
    todo, seen = list(dists), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for r in map(Requirement, reqs):
            if r.marker is None or r.marker.evaluate({'extra': ''}):
                todo.append(canonicalize_name(r.name))
    return seen


def module_imports(tree):
    """Top-level names of the absolute imports in ``tree``, including modules named by string
    to ``imported(...)`` or ``importlib.import_module(...)``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split('.')[0])
        elif isinstance(node, ast.Call) and node.args:
            func = getattr(node.func, 'id', None) or getattr(node.func, 'attr', None)
            first = node.args[0]
            if func in ('imported', 'import_module') and isinstance(first, ast.Constant):
                found.add(first.value.split('.')[0])
    return found


def third_party_imports(package=osp.join(ROOT, 'mmrepa')):
    """{top-level module: files of ``package`` that import it}, outside the standard library."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = [d for d in dirnames if not d.startswith(('.', '__'))]
        for name in (f for f in filenames if f.endswith('.py')):
            path = osp.join(dirpath, name)
            with open(path, encoding='utf-8') as f:
                tree = ast.parse(f.read())
            for module in module_imports(tree) - set(sys.stdlib_module_names) - {'mmrepa'}:
                found.setdefault(module, []).append(osp.relpath(path, ROOT))
    return found


def distributions(module):
    return {canonicalize_name(d) for d in packages_distributions().get(module, [])}


def uncovered_imports(imports, install_requires, extras):
    """'module (files): why' for every import setup.py does not account for."""
    named = names(install_requires).union(*(names(r) for r in extras.values()))
    covered = closure(named)
    problems = []
    for module, files in sorted(imports.items()):
        if module in NOT_IN_SETUP:
            continue
        dists = distributions(module)
        if not dists:
            problems.append(f'{module} ({files[0]}): no installed distribution provides it')
        elif not dists & covered:
            problems.append(f'{module} ({files[0]}): {sorted(dists)} is in no setup.py list')
    return problems


def test_setup_py_accounts_for_every_import():
    imports = third_party_imports()
    assert {'torch', 'mmengine', 'timm', 'onnxruntime'} <= set(imports)  # the scan sees them
    problems = uncovered_imports(imports, *setup_requirements())
    assert not problems, 'imports setup.py does not name:\n' + '\n'.join(problems)


def test_every_extra_is_imported():
    _, extras = setup_requirements()
    imported = set().union(*map(distributions, third_party_imports()))
    unused = {d for r in extras.values() for d in names(r)} - imported - set(NOT_IMPORTED)
    assert not unused, f'extras that mmrepa/ never imports: {sorted(unused)}'


def test_the_check_finds_a_missing_requirement():
    imports = {'torch': ['a.py'], 'timm': ['b.py'], 'cv2': ['c.py'], 'nowhere_x': ['d.py']}
    problems = uncovered_imports(imports, ['torch', 'mmcv'], {'onnx': ['onnx']})
    assert [p.split(' ')[0] for p in problems] == ['nowhere_x', 'timm'], problems


def test_installed_versions_fit_setup_py():
    install_requires, extras = setup_requirements()
    bad = [
        f'{r}: {version(r.name)} is installed'
        for r in map(Requirement, install_requires + [r for v in extras.values() for r in v])
        if not r.specifier.contains(version(r.name), prereleases=True)
    ]
    assert not bad, bad


def test_import_mmrepa_loads_no_extra():
    """Only what install_requires brings: timm, onnx, openvino and the rest load when used."""
    install_requires, extras = setup_requirements()
    core = closure(names(install_requires))
    optional = {d for r in extras.values() for d in names(r)} - core
    code = 'import sys, mmrepa\nprint(" ".join({m.split(".")[0] for m in list(sys.modules)}))'
    out = subprocess.run(
        [sys.executable, '-c', code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    loaded = {m: distributions(m) & optional for m in out.split()}
    assert not {m: d for m, d in loaded.items() if d}, 'import mmrepa loads an extra'
