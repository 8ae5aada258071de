"""Sphinx configuration of mmrepa's documentation (Markdown pages read by MyST).

    make docs    # or: python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The build is strict (warnings are errors, unresolved references too), so a broken link between
pages or to a heading fails it. tests/integration/test_docs.py runs the same build.
"""

import os.path as osp
import re

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _version() -> str:
    # read, not imported: the docs build needs neither torch nor mmcv
    with open(osp.join(ROOT, 'mmrepa', 'version.py')) as f:
        return re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read()).group(1)


project = 'mmrepa'
author = 'mmrepa contributors'
copyright = 'mmrepa contributors'
release = version = _version()

extensions = ['myst_parser']
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
exclude_patterns = ['_build', 'Thumbs.db', '.DS_Store']

# MyST: GitHub-style anchors for headings down to level 3, so `page.md#a-heading` links work
# here as they do on GitHub; strict checking of every cross-reference.
myst_heading_anchors = 3
myst_enable_extensions = ['colon_fence', 'deflist']
nitpicky = True
suppress_warnings = []

html_theme = 'furo'
html_title = f'mmrepa {release}'
html_static_path = []
pygments_style = 'sphinx'
