"""Where a number was measured: the CPU, its vector extensions, threads, load and versions.

Every benchmark that writes JSON puts :func:`machine_info` under one key, ``"machine"``, taken
when the measurement starts; :func:`finish` adds the load average when it ends::

    machine = machine_info()
    ...  # measure
    result['machine'] = finish(machine)

A latency means little without this: the same model runs several times faster where torch and
onnxruntime find AVX-512, VNNI (INT8 dot products) or AMX, and slower on a loaded machine.
"""

import os
import os.path as osp
import platform
import subprocess
from typing import Dict, List, Optional

import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# /proc/cpuinfo flags that are SIMD instruction sets. x86 ("flags"): every SSE4 / AVX / AVX-512
# / AMX subset the kernel names (avx2, avx512f, avx512_vnni, avx512_bf16, avx_vnni, amx_tile,
# ...), FMA and F16C. Arm ("Features"): the NEON, SVE and SME families, BF16 and I8MM.
_VECTOR = {
    'flags': (('sse4', 'avx', 'amx'), {'fma', 'f16c'}),
    'Features': (('asimd', 'sve', 'sme'), {'bf16', 'i8mm'}),
}


def read_cpuinfo(path: str = '/proc/cpuinfo') -> Dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo (empty where there is
    none)."""
    info = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    if info:
                        break  # the next processor repeats the same fields
                    continue
                key, _, value = line.partition(':')
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_flags(cpuinfo: Optional[Dict[str, str]] = None) -> List[str]:
    """The CPU's feature flags (x86: ``flags``; Arm: ``Features``), in the kernel's order."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    return (cpuinfo.get('flags') or cpuinfo.get('Features') or '').split()


def vector_extensions(cpuinfo: Optional[Dict[str, str]] = None) -> List[str]:
    """The SIMD extensions among the CPU's flags, in the kernel's order."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    key = 'flags' if 'flags' in cpuinfo else 'Features'
    prefixes, names = _VECTOR[key]
    return [f for f in cpuinfo.get(key, '').split() if f.startswith(prefixes) or f in names]


def cpu_model(cpuinfo: Optional[Dict[str, str]] = None) -> str:
    """The CPU model ("model name" in /proc/cpuinfo; platform.processor() is often empty)."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    return cpuinfo.get('model name') or platform.processor() or platform.machine()


def load_average() -> Optional[List[float]]:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 3) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def git_commit(root: str = ROOT) -> Optional[str]:
    """The short commit checked out at ``root``, with " (modified)" if tracked files differ from
    it; None outside a git checkout."""

    def git(*args):
        proc = subprocess.run(['git', *args], cwd=root, capture_output=True, text=True, timeout=30)
        return proc.stdout.strip() if proc.returncode == 0 else None

    try:
        commit = git('rev-parse', '--short', 'HEAD')
        if not commit:
            return None
        modified = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + (' (modified)' if modified else '')


def _int_or_none(value: Optional[str]) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _version(package: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine_info() -> dict:
    """This machine and process as a JSON-ready dict, with the load average now as
    ``load_average_start`` (:func:`finish` adds ``load_average_end``).

    Keys: ``cpu`` (model), ``vendor``, ``cpu_family`` / ``cpu_model_number`` (x86),
    ``vector_extensions`` (the SIMD flags of /proc/cpuinfo), ``torch_cpu_capability`` (the
    kernels torch dispatches to: DEFAULT, AVX2, AVX512, ...), ``logical_cores`` (os.cpu_count),
    ``usable_cores`` (this process's affinity), ``threads`` (torch.get_num_threads),
    ``omp_num_threads`` (the environment's OMP_NUM_THREADS, None if unset), ``load_average_start``
    / ``load_average_end``, ``python`` / ``torch`` / ``onnxruntime`` / ``openvino`` / ``nncf``
    versions (None if not installed), ``platform`` and ``git_commit``.
    """
    cpuinfo = read_cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    capability = getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', None)
    return dict(
        cpu=cpu_model(cpuinfo),
        vendor=cpuinfo.get('vendor_id') or cpuinfo.get('CPU implementer'),
        cpu_family=_int_or_none(cpuinfo.get('cpu family')),
        cpu_model_number=_int_or_none(cpuinfo.get('model')),
        vector_extensions=vector_extensions(cpuinfo),
        torch_cpu_capability=capability() if capability else None,
        logical_cores=os.cpu_count(),
        usable_cores=usable,
        threads=torch.get_num_threads(),
        omp_num_threads=os.environ.get('OMP_NUM_THREADS'),
        load_average_start=load_average(),
        load_average_end=None,
        python=platform.python_version(),
        torch=torch.__version__,
        onnxruntime=_version('onnxruntime'),
        openvino=_version('openvino'),
        nncf=_version('nncf'),
        platform=platform.platform(),
        git_commit=git_commit(),
    )


def finish(machine: dict) -> dict:
    """``machine`` with the load average now as ``load_average_end``."""
    machine['load_average_end'] = load_average()
    return machine
