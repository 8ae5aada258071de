"""Sphinx configuration of mmrepa's documentation (Markdown pages read by MyST).

    make docs    # or: python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The build is strict (warnings are errors, unresolved references too), so a broken link between
pages or to a heading fails it. tests/integration/test_docs.py runs the same build. The API
reference (api.md) is read from the docstrings by autodoc: it imports mmrepa, so the build
needs the environment `make install-tests` makes (torch, mmengine, mmcv).
"""

import importlib
import os.path as osp
import re
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's mmrepa, whatever is installed


def _version() -> str:
    # read, not imported: the docs build needs neither torch nor mmcv
    with open(osp.join(ROOT, 'mmrepa', 'version.py')) as f:
        return re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read()).group(1)


project = 'mmrepa'
author = 'mmrepa contributors'
copyright = 'mmrepa contributors'
release = version = _version()

extensions = ['myst_parser', 'sphinx.ext.autodoc', 'sphinx.ext.napoleon']
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
exclude_patterns = ['_build', 'Thumbs.db', '.DS_Store']

# MyST: GitHub-style anchors for headings down to level 3, so `page.md#a-heading` links work
# here as they do on GitHub; strict checking of every cross-reference.
myst_heading_anchors = 3
myst_enable_extensions = ['colon_fence', 'deflist']
nitpicky = True
suppress_warnings = []

# autodoc: each package's public names (its __all__), in source order, without signatures'
# annotations (torch's and mmengine's types have no pages here to link to), without the
# docstrings of other projects' methods a class overrides
autodoc_default_options = {'members': True, 'member-order': 'bysource'}
autodoc_typehints = 'none'
autodoc_class_signature = 'mixed'
autodoc_inherit_docstrings = False
# Google-style sections (Args:, Returns:) read by napoleon, through _google_sections below;
# argument types as text, not as references to look up
napoleon_google_docstring = False
napoleon_numpy_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False
# References with no page here: other projects' names, modules (this reference documents
# packages) and private names. Any other name a docstring cites that is not documented must
# at least exist (_existing_name below), or the build fails.
nitpick_ignore_regex = [
    (
        r'py:.*',
        r'~?(torch|nn|F|mmengine|mmcv|mmdet|mmseg|mmpretrain|mmdeploy|timm|numpy|np|onnx'
        r'|onnxruntime|openvino|nncf)(\..*)?',
    ),
    (r'py:mod', r'.*'),
    (r'py:.*', r'(.*\.)?_[^.]*(\..*)?'),
]


def _google_sections(app, what, name, obj, options, lines):
    """napoleon's Google-style sections for functions and classes; an attribute's or a
    property's docstring stays prose (napoleon would take its 'X: y' first line for a type)."""
    if what not in ('attribute', 'property', 'data'):
        from sphinx.ext.napoleon.docstring import GoogleDocstring

        lines[:] = GoogleDocstring(lines, app.config, app, what, name, obj, options).lines()


def _lookup(path):
    """The object a dotted path names (its longest importable module, then attributes)."""
    parts = path.split('.')
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _existing_name(app, env, node, contnode):
    """A py reference to an mmrepa name that exists but is not in the reference (a module's
    helper, an inherited method, a class another package exports) renders as code; a name
    that exists nowhere stays an error. Tried: the target as written, then under the class,
    the module and the modules of the package the docstring is documented in."""
    if node.get('refdomain') != 'py':
        return None
    target = ''.join(node['reftarget'].split()).lstrip('~.')
    module, klass = node.get('py:module') or '', node.get('py:class') or ''
    scopes = ['', f'{module}.{klass}.' if klass else None, f'{module}.']
    scopes += [f'{name}.' for name in sorted(sys.modules) if name.startswith(f'{module}.')]
    for scope in filter(lambda s: s is not None, scopes):
        if not (scope + target).startswith('mmrepa'):
            continue
        try:
            _lookup(scope + target)
        except (ImportError, AttributeError):
            continue
        return contnode
    return None


def setup(app):
    app.connect('autodoc-process-docstring', _google_sections)
    app.connect('missing-reference', _existing_name)


html_theme = 'furo'
html_title = f'mmrepa {release}'
html_static_path = []
pygments_style = 'sphinx'
