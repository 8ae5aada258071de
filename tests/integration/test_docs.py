"""The documentation: README.md and docs/ build strictly with Sphinx + MyST, every relative link
points to a file that exists (and, for ``page.md#anchor``, to a heading of that page, with
GitHub's anchors), and nothing cites a document that is not in the repository."""

import os
import os.path as osp
import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

DOCS = osp.join(ROOT, 'docs')


def doc_files():
    """README.md and every Markdown page under docs/ (not the build output)."""
    files = [osp.join(ROOT, 'README.md')]
    for dirpath, dirnames, filenames in os.walk(DOCS):
        dirnames[:] = sorted(d for d in dirnames if d != '_build' and not d.startswith('.'))
        files += [osp.join(dirpath, f) for f in sorted(filenames) if f.endswith('.md')]
    return files


# ------------------------------------------------------------------ Markdown, as GitHub reads it
FENCE = re.compile(r'^ {0,3}(`{3,}|~{3,})')


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif (
            fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
        ):
            fence = None
        elif fence is None:
            yield number, line


def github_anchor(heading):
    """The id GitHub gives a heading: its text, lower case, without punctuation but ``-`` and
    ``_``, spaces as ``-`` (MyST's ``myst_heading_anchors`` makes the same ones)."""
    text = re.sub(r'!\[[^\]]*\]\([^)]*\)', '', heading)  # images
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)  # links: their text
    text = re.sub(r'<[^>]+>', '', text)  # html tags
    text = text.replace('`', '').replace('*', '')
    return re.sub(r'[^\w\- ]', '', text.strip().lower()).replace(' ', '-')


def anchors(path):
    """Every heading anchor of a Markdown file, numbered as GitHub numbers repeats."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    seen, result = {}, set()
    for _, line in prose_lines(text):
        m = re.match(r'^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$', line)
        if m:
            slug = github_anchor(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            result.add(slug if n == 0 else f'{slug}-{n}')
    return result


LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
REFERENCE = re.compile(r'^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$')


def links(path):
    """(line number, target) of every inline or reference link outside code."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    for number, line in prose_lines(text):
        line = re.sub(r'`[^`]*`', '', line)  # inline code
        m = REFERENCE.match(line)
        if m:
            yield number, m.group(1)
        for m in LINK.finditer(line):
            yield number, m.group(1)


def broken_links(paths):
    """'file:line: target (why)' for every relative link that leads nowhere."""
    problems = []
    for path in paths:
        own = None
        for number, target in links(path):
            if re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*:', target) or target.startswith('//'):
                continue  # http:, https:, mailto: ... are not checked (no network)
            file_part, _, anchor = target.partition('#')
            where = f'{osp.relpath(path, ROOT)}:{number}: {target}'
            if file_part:
                dest = osp.normpath(osp.join(osp.dirname(path), file_part))
                if not osp.exists(dest):
                    problems.append(f'{where} (no such file)')
                    continue
            else:
                dest = path
            if anchor and dest.endswith('.md') and osp.isfile(dest):
                if dest == path:
                    own = own if own is not None else anchors(path)
                    known = own
                else:
                    known = anchors(dest)
                if anchor not in known:
                    problems.append(f'{where} (no heading with anchor #{anchor})')
    return problems


# ----------------------------------------------------------------------------------- the tests
def test_every_relative_link_leads_somewhere():
    problems = broken_links(doc_files())
    assert not problems, 'broken links:\n' + '\n'.join(problems)


def test_the_link_check_finds_broken_links(tmp_path):
    (tmp_path / 'other.md').write_text(
        '# Other page\n\n## A `code` heading, twice\n\n## A `code` heading, twice\n'
    )
    page = tmp_path / 'page.md'
    page.write_text(
        '# Page\n\n## Local heading\n\n'
        '[ok](other.md) [ok](other.md#a-code-heading-twice-1) [ok](#local-heading)\n'
        '[ok](https://example.org/nowhere) `[not a link](missing.md)`\n'
        '```\n[in code](missing.md)\n# not a heading\n```\n'
        '[bad](missing.md) [bad](other.md#nope) [bad](#not-a-heading)\n'
        '[ref]: missing-too.md\n'
    )
    problems = broken_links([str(page)])
    assert len(problems) == 4, problems
    for target in ('missing.md', 'other.md#nope', '#not-a-heading', 'missing-too.md'):
        assert any(f' {target} (' in p for p in problems), (target, problems)


def test_github_anchors():
    assert (
        github_anchor('4. Train on COCO, ADE20K or your own data')
        == '4-train-on-coco-ade20k-or-your-own-data'
    )
    assert github_anchor('Checkpoints and `weights_only`') == 'checkpoints-and-weights_only'
    assert github_anchor('INT8 (onnxruntime)') == 'int8-onnxruntime'


def test_no_reference_to_documents_outside_the_repository():
    """The project's notes outside the repository are cited nowhere: README, docs/, and every
    Python file (the package, tools, configs, tests, benchmarks) cite papers or docs/."""
    files = [osp.join(ROOT, 'README.md')]
    for dirpath, dirnames, filenames in os.walk(DOCS):
        dirnames[:] = [d for d in dirnames if d != '_build']
        files += [osp.join(dirpath, f) for f in filenames]
    for top in ('mmrepa', 'tools', 'configs', 'tests', 'benchmarks'):
        for dirpath, dirnames, filenames in os.walk(osp.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ('.mim', '__pycache__')]
            files += [osp.join(dirpath, f) for f in filenames if f.endswith('.py')]
    word = 'SP' + 'EC'  # spelled apart, so that this file does not match itself
    hits = []
    for path in files:
        with open(path, encoding='utf-8', errors='replace') as f:
            hits += [
                f'{osp.relpath(path, ROOT)}:{n}' for n, line in enumerate(f, 1) if word in line
            ]
    assert not hits, hits


def test_sphinx_build_is_strict_and_clean(tmp_path):
    for module in ('sphinx', 'myst_parser', 'furo'):
        try:
            __import__(module)
        except ImportError:
            pytest.fail(
                f'{module} is not installed: requirements/docs.txt '
                '(tools/install_deps.sh PYTHON --tests, or make install-tests)'
            )
    out = tmp_path / 'html'
    proc = subprocess.run(
        [
            sys.executable,
            '-m',
            'sphinx',
            '-W',
            '--keep-going',
            '-n',
            '-q',
            '-b',
            'html',
            '-d',
            str(tmp_path / 'doctrees'),
            DOCS,
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (out / 'index.html').is_file()
    assert (out / 'backbones' / 'repa_swin.html').is_file()
