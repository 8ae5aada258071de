"""Latency measurement shared by ``ReparameterizeHook`` and ``tools/benchmark.py``.

Variants are timed interleaved (A B A B ...) so that drift of the machine (thermal state,
other load) affects all of them alike.
"""

import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from ..errors import InputError
from .machine import cpu_model


def cpu_name() -> str:
    """The CPU model (Linux reports it in /proc/cpuinfo; platform.processor() is often empty).
    A benchmark's JSON records the whole machine: :func:`mmrepa.utils.machine.machine_info`."""
    return cpu_model()


class LatencyStats(NamedTuple):
    """Per-call timings of one variant, in milliseconds."""

    median: float
    min: float
    max: float
    samples: List[float]

    @classmethod
    def of(cls, samples_ms: List[float]) -> 'LatencyStats':
        return cls(
            statistics.median(samples_ms), min(samples_ms), max(samples_ms), list(samples_ms)
        )


def _device_of(device) -> torch.device:
    return torch.device(device) if device is not None else torch.device('cpu')


def time_call(fn: Callable[[], object], device=None) -> float:
    """Wall time of one ``fn()`` in milliseconds, synchronising the GPU around it."""
    device = _device_of(device)
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_interleaved(
    variants: Dict[str, Callable[[], object]],
    repeat: int = 10,
    warmup: int = 2,
    device=None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, LatencyStats]:
    """Time each variant ``repeat`` times after ``warmup`` untimed rounds, interleaved.

    Args:
        variants: Name -> zero-argument callable doing one unit of work.
        repeat: Timed rounds; each round calls every variant once.
        warmup: Untimed rounds first (allocator, caches, lazy init).
        device: Where the work runs; CUDA work is timed with events after synchronising.
        progress: Called as ``progress(done, total)`` after every round.
    Returns:
        Name -> :class:`LatencyStats` in milliseconds per call.

    Gradients are as the caller has them: wrap in ``torch.no_grad()`` to time inference.
    """
    if repeat < 1:
        raise InputError(f'repeat must be >= 1, got {repeat}')
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples = {name: [] for name in variants}
    for r in range(repeat):
        for name, fn in variants.items():
            samples[name].append(time_call(fn, device))
        if progress is not None:
            progress(r + 1, repeat)
    return {name: LatencyStats.of(s) for name, s in samples.items()}
