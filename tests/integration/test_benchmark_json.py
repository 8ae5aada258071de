"""Every measured number says where it was measured: the ``machine`` block (CPU model, vector
extensions, threads, load) of mmrepa.utils.machine in the benchmarks' JSON."""

import glob
import json
import os
import os.path as osp

import pytest
import torch
import torch.nn as nn

from mmrepa.utils.machine import finish, machine_info, vector_extensions
from tests.helpers import ROOT, script_module

RESULTS = sorted(glob.glob(osp.join(ROOT, 'benchmarks', 'results', '*.json')))


def check_machine(machine):
    assert isinstance(machine, dict), machine
    assert isinstance(machine['cpu'], str) and machine['cpu'], machine
    assert isinstance(machine['vector_extensions'], list), machine
    assert all(isinstance(f, str) for f in machine['vector_extensions']), machine
    assert machine['threads'] is None or machine['threads'] >= 1, machine
    for key in ('omp_num_threads', 'load_average_start', 'load_average_end', 'torch'):
        assert key in machine, (key, machine)


def test_results_exist():
    assert len(RESULTS) >= 10, RESULTS


@pytest.mark.parametrize('path', RESULTS, ids=osp.basename)
def test_every_result_says_where_it_was_measured(path):
    with open(path) as f:
        result = json.load(f)
    machine = result['machine']
    check_machine(machine)
    if 'threads' in result:  # tools/benchmark.py's own field: the two agree
        assert machine['threads'] == result['threads'], (machine['threads'], result['threads'])
    for row in (*result.get('models', {}).values(), *result.get('runs', ())):
        if 'machine' in row:  # measured by a run of its own (--only)
            check_machine(row['machine'])


def naive_flags():
    with open('/proc/cpuinfo') as f:
        for line in f:
            if line.startswith(('flags', 'Features')):
                return line.split(':', 1)[1].split()
    return []


@pytest.mark.skipif(not osp.exists('/proc/cpuinfo'), reason='no /proc/cpuinfo')
def test_machine_info_reads_this_machine():
    machine = finish(machine_info())
    check_machine(machine)
    flags = naive_flags()
    for ext in ('avx2', 'avx512f', 'avx512_vnni', 'avx_vnni', 'amx_tile', 'avx512_bf16'):
        assert (ext in machine['vector_extensions']) == (ext in flags), ext
    assert set(machine['vector_extensions']) <= set(flags)
    assert machine['threads'] == torch.get_num_threads()
    assert machine['omp_num_threads'] == os.environ.get('OMP_NUM_THREADS')
    assert machine['logical_cores'] == os.cpu_count()
    assert len(machine['load_average_start']) == len(machine['load_average_end']) == 3
    assert machine['torch'] == torch.__version__
    assert machine['torch_cpu_capability'] == torch.backends.cpu.get_cpu_capability()
    json.dumps(machine)  # JSON as it is


def test_vector_extensions_name_every_simd_subset_and_nothing_else():
    sapphire_rapids = (
        'fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c smep avx2 avx512f avx512dq '
        'avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni avx_vnni amx_bf16 '
        'amx_tile amx_int8 sha_ni'
    )
    assert vector_extensions({'flags': sapphire_rapids}) == [
        'fma',
        'sse4_1',
        'sse4_2',
        'avx',
        'f16c',
        'avx2',
        'avx512f',
        'avx512dq',
        'avx512cd',
        'avx512bw',
        'avx512vl',
        'avx512_bf16',
        'avx512_vnni',
        'avx_vnni',
        'amx_bf16',
        'amx_tile',
        'amx_int8',
    ]
    graviton3 = 'fp asimd aes sha2 asimddp sve i8mm bf16 svebf16 paca'
    assert vector_extensions({'Features': graviton3}) == [
        'asimd',
        'asimddp',
        'sve',
        'i8mm',
        'bf16',
        'svebf16',
    ]
    assert vector_extensions({}) == []


class Tiny(nn.Module):
    """A model with a backbone: all tools/benchmark.py's backbone scope needs."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.cfg = None  # unused with --shape and --backbone-only


def test_benchmark_tool_writes_the_machine(tmp_path, monkeypatch):
    benchmark = script_module('tools/benchmark.py')
    # the tool as it runs, on a model built here (building one from a config imports mmpretrain)
    monkeypatch.setattr(benchmark, 'init_model', lambda *args: Tiny().eval())
    out = tmp_path / 'result.json'
    benchmark.main(
        [
            'tiny.py',
            '--shape',
            '16',
            '16',
            '--backbone-only',
            '--repeat',
            '1',
            '--warmup',
            '0',
            '--device',
            'cpu',
            '--out',
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    machine = result['machine']
    check_machine(machine)
    assert machine['threads'] == result['threads']
    assert machine['load_average_start'] is not None and machine['load_average_end'] is not None
    assert result['device_name'] == machine['cpu']  # the field readers had before stays
