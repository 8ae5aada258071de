"""Atomic writes (mmrepa.utils.files): the output appears whole with the user's file mode, or
not at all, and nothing temporary stays behind; SIGTERM in a subprocess included."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mmrepa.utils import files
from mmrepa.utils.files import atomic_folder, atomic_output, current_umask, write_json


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_current_umask_reads_the_process_umask(umask_027):
    assert current_umask() == 0o027


def test_a_written_file_gets_the_umask_mode_and_leaves_no_temporary(tmp_path, umask_027):
    target = tmp_path / 'out.json'
    with atomic_output(str(target)) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path)
        assert os.path.basename(tmp).startswith('.out.json.') and tmp.endswith('.tmp.json')
        assert not target.exists()  # nothing at the target until the block ends
        with open(tmp, 'w') as f:
            f.write('new')
    assert target.read_text() == 'new'
    assert target.stat().st_mode & 0o777 == 0o640  # 0666 without the umask's 027
    assert os.listdir(tmp_path) == ['out.json']


def test_an_error_leaves_the_old_file_and_removes_what_it_created(tmp_path):
    old = tmp_path / 'old.txt'
    old.write_text('old')
    with pytest.raises(OSError), atomic_output(str(old)) as tmp:
        with open(tmp, 'w') as f:
            f.write('half')
        raise OSError('disk full')
    assert old.read_text() == 'old' and os.listdir(tmp_path) == ['old.txt']
    deep = tmp_path / 'a' / 'b' / 'c.txt'
    with pytest.raises(KeyboardInterrupt), atomic_output(str(deep)):
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ['old.txt']  # a/ and a/b/ are gone again


def test_a_folder_replaces_or_merges(tmp_path, umask_027):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'kept.txt').write_text('kept')
    (out / 'same.txt').write_text('old')
    with atomic_folder(str(out), replace=False) as tmp:
        os.makedirs(os.path.join(tmp, 'sub'))
        for name in ('same.txt', 'sub/new.txt'):
            with open(os.path.join(tmp, name), 'w') as f:
                f.write('new')
    assert (out / 'kept.txt').read_text() == 'kept' and (out / 'same.txt').read_text() == 'new'
    assert (out / 'sub' / 'new.txt').read_text() == 'new'
    with atomic_folder(str(out)) as tmp:
        with open(os.path.join(tmp, 'only.txt'), 'w') as f:
            f.write('x')
    assert sorted(os.listdir(out)) == ['only.txt']
    assert out.stat().st_mode & 0o777 == 0o750  # 0777 without 027, not mkdtemp's 0700
    assert os.listdir(tmp_path) == ['out']


def test_a_failed_folder_leaves_the_old_one(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'a.txt').write_text('a')
    with pytest.raises(RuntimeError), atomic_folder(str(out)) as tmp:
        with open(os.path.join(tmp, 'b.txt'), 'w') as f:
            f.write('b')
        raise RuntimeError
    assert os.listdir(out) == ['a.txt'] and os.listdir(tmp_path) == ['out']


def test_write_json_round_trips(tmp_path):
    path = tmp_path / 'x' / 'r.json'
    write_json({'a': [1, 2.5], 'b': None}, str(path))
    assert json.loads(path.read_text()) == {'a': [1, 2.5], 'b': None}
    assert path.read_text().startswith('{\n  "a"')  # indented by 2


def test_sigterm_during_a_write_ends_the_process_after_the_clean_up(tmp_path):
    """The module is loaded by its path (no mmrepa import: it imports nothing of mmrepa)."""
    target = tmp_path / 'out.txt'
    target.write_text('old')
    code = textwrap.dedent(f"""
        import importlib.util, os, signal
        spec = importlib.util.spec_from_file_location('files', {files.__file__!r})
        files = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(files)
        with files.atomic_output({str(target)!r}) as tmp:
            with open(tmp, 'w') as f:
                f.write('half')
            os.kill(os.getpid(), signal.SIGTERM)
            raise SystemExit('not reached: the signal unwinds the block')
    """)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert target.read_text() == 'old' and os.listdir(tmp_path) == ['out.txt']
