"""What a benchmark records of its machine (mmrepa.utils.machine): /proc/cpuinfo read by
field, the SIMD flags picked out, the git commit, and the JSON record's keys."""

import os
import subprocess

import pytest

from mmrepa.utils import machine

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 sse4_1 sse4_2 fma avx avx2 f16c avx512f avx512_vnni avx512_bf16 amx_tile ht

processor\t: 1
model name\t: another
"""
ARM = 'processor\t: 0\nFeatures\t: fp asimd evtstrm sve sve2 bf16 i8mm sme crc32\n'


@pytest.fixture
def x86(tmp_path):
    path = tmp_path / 'cpuinfo'
    path.write_text(X86)
    return machine.read_cpuinfo(str(path))


def test_the_first_processor_is_read(x86, tmp_path):
    assert x86['model name'] == 'AMD EPYC 9B14' and x86['cpu family'] == '25'
    assert x86['processor'] == '0'
    assert machine.read_cpuinfo(str(tmp_path / 'none')) == {}


def test_vector_extensions_x86(x86):
    assert machine.cpu_flags(x86)[:3] == ['fpu', 'sse2', 'sse4_1']
    assert machine.vector_extensions(x86) == [
        'sse4_1', 'sse4_2', 'fma', 'avx', 'avx2', 'f16c', 'avx512f', 'avx512_vnni',
        'avx512_bf16', 'amx_tile',
    ]  # fmt: skip
    assert machine.cpu_model(x86) == 'AMD EPYC 9B14'


def test_vector_extensions_arm(tmp_path):
    path = tmp_path / 'cpuinfo'
    path.write_text(ARM)
    info = machine.read_cpuinfo(str(path))
    assert machine.vector_extensions(info) == ['asimd', 'sve', 'sve2', 'bf16', 'i8mm', 'sme']
    assert machine.cpu_flags(info)[0] == 'fp'


def test_git_commit(tmp_path):
    def git(*args):
        return subprocess.run(
            ['git', '-c', 'user.name=t', '-c', 'user.email=t@t', *args],
            cwd=tmp_path, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    assert machine.git_commit(str(tmp_path)) is None  # not a checkout
    git('init', '-q')
    (tmp_path / 'f.txt').write_text('1')
    git('add', 'f.txt')
    git('commit', '-q', '-m', 'one')
    short = git('rev-parse', '--short', 'HEAD')
    assert machine.git_commit(str(tmp_path)) == short
    (tmp_path / 'f.txt').write_text('2')
    assert machine.git_commit(str(tmp_path)) == f'{short} (modified)'


def test_machine_info_and_finish(monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    info = machine.machine_info()
    assert info['omp_num_threads'] == '3' and info['load_average_end'] is None
    assert info['usable_cores'] == len(os.sched_getaffinity(0))
    assert info['logical_cores'] == os.cpu_count()
    assert info['cpu'] == machine.cpu_model()
    assert machine.finish(info) is info and len(info['load_average_end']) == 3
    assert machine._int_or_none('17') == 17 and machine._int_or_none(None) is None
