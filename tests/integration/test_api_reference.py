"""docs/api.md, the API reference autodoc reads from the docstrings: it covers every public
package, and its strict build refuses a docstring's reference to a name that exists nowhere
while rendering one to an existing, undocumented mmrepa name as code (docs/conf.py). The build
itself runs in test_docs.py."""

import importlib.util
import os
import os.path as osp
import re

import pytest

from tests.helpers import ROOT


def public_packages() -> set:
    """The packages whose names are the API: mmrepa's subpackages (and mmrepa.engine's) that
    declare ``__all__``, but not the tools' glue (mmrepa.integrations) nor mmrepa.engine, which
    re-exports its subpackages; and the modules apis, errors, engine.strategies, engine.loops."""
    found = {'mmrepa.apis', 'mmrepa.errors', 'mmrepa.engine.strategies', 'mmrepa.engine.loops'}
    for parent in ('mmrepa', 'mmrepa.engine'):
        folder = osp.join(ROOT, *parent.split('.'))
        for name in sorted(os.listdir(folder)):
            init = osp.join(folder, name, '__init__.py')
            if osp.isfile(init) and name not in ('integrations', 'engine'):
                with open(init, encoding='utf-8') as f:
                    if '__all__' in f.read():
                        found.add(f'{parent}.{name}')
    return found


def documented_modules():
    with open(osp.join(ROOT, 'docs', 'api.md'), encoding='utf-8') as f:
        return re.findall(r'^\.\. automodule:: (\S+)$', f.read(), re.M)


@pytest.fixture(scope='module')
def conf():
    spec = importlib.util.spec_from_file_location('docs_conf', osp.join(ROOT, 'docs', 'conf.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_package_is_in_the_reference():
    modules, public = documented_modules(), public_packages()
    assert {'mmrepa.backbones', 'mmrepa.engine.hooks', 'mmrepa.selfsup'} <= public
    assert not public - set(modules), sorted(public - set(modules))
    for name in modules:
        importlib.import_module(name)  # autodoc imports each: a moved module fails here first


@pytest.mark.parametrize(
    'target, module, klass, exists',
    [
        ('reparameterize', 'mmrepa.backbones', 'RePaViT', True),  # inherited method
        ('WEIGHT_KEYS', 'mmrepa.checkpoint', None, True),  # a name of one of its modules
        ('mmrepa.fold.fold_model', 'mmrepa.layers', None, True),
        ('no_such_name', 'mmrepa.backbones', 'RePaViT', False),
        ('mmrepa.fold.no_such_name', 'mmrepa.fold', None, False),
        ('The share', 'mmrepa.layers', 'TokenBox', False),
    ],
)
def test_references_to_existing_names_only(conf, target, module, klass, exists):
    node = {'refdomain': 'py', 'reftarget': target, 'py:module': module, 'py:class': klass}
    code = object()
    assert (conf._existing_name(None, None, node, code) is code) == exists
