"""The modules of ``mmrepa.fold`` import one another without a circle, counting imports inside
functions too (a late import hides a circle; it does not remove it)."""

import ast
import os
import os.path as osp

from tests.helpers import ROOT

FOLD = osp.join(ROOT, 'mmrepa', 'fold')


def sibling_imports(path):
    """The ``mmrepa.fold`` modules that the file at ``path`` imports, anywhere in it."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split('.')[0])
            else:  # from . import x
                found.update(alias.name for alias in node.names)
    return found


def find_circle(graph):
    """One import circle of ``graph`` (module -> modules it imports) as a list, or None."""
    done, path = set(), []

    def visit(name):
        if name in path:
            return path[path.index(name) :] + [name]
        if name in done:
            return None
        path.append(name)
        for other in sorted(graph.get(name, ())):
            circle = visit(other)
            if circle:
                return circle
        path.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        circle = visit(name)
        if circle:
            return circle
    return None


def fold_graph(directory=FOLD):
    """module -> the sibling modules it imports, for every module of the package."""
    modules = {f[:-3] for f in os.listdir(directory) if f.endswith('.py') and f != '__init__.py'}
    return {m: sibling_imports(osp.join(directory, f'{m}.py')) & modules for m in modules}


def test_the_fold_modules_import_without_a_circle():
    graph = fold_graph()
    assert graph['protocol'] >= {'base'}  # the scan sees imports at all
    circle = find_circle(graph)
    assert circle is None, 'import circle in mmrepa.fold: ' + ' -> '.join(circle)


def test_find_circle_finds_one():
    assert find_circle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_circle({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) is None
