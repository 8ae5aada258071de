"""Interleaved timing (mmrepa.utils.latency): the order of the calls, what is timed, and the
statistics, on a fake clock that each call moves by a known amount."""

import statistics
import time

import pytest

from mmrepa.errors import InputError
from mmrepa.utils import latency
from mmrepa.utils.latency import LatencyStats, time_call, time_interleaved


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rounds_interleave_after_warmup_and_time_each_call(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(latency.time, 'perf_counter', clock)

    def variant(name, seconds):
        def fn():
            calls.append(name)
            clock.now += seconds

        return fn

    progress = []
    stats = time_interleaved(
        {'a': variant('a', 0.002), 'b': variant('b', 0.005)},
        repeat=3,
        warmup=2,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert calls == ['a', 'b'] * 5  # 2 untimed rounds, then 3 timed ones, A B A B ...
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert stats['a'].samples == pytest.approx([2.0] * 3)
    assert stats['b'].samples == pytest.approx([5.0] * 3)


def test_latency_stats():
    samples = [3.0, 1.0, 2.0, 10.0]
    s = LatencyStats.of(samples)
    assert (s.median, s.min, s.max) == (statistics.median(samples), 1.0, 10.0)
    assert s.samples == samples and s.samples is not samples


def test_time_call_measures_the_wall_time():
    ms = time_call(lambda: time.sleep(0.03))
    assert 30.0 <= ms < 3000.0


def test_no_timed_round_is_refused():
    with pytest.raises(InputError, match='repeat must be >= 1'):
        time_interleaved({'a': lambda: None}, repeat=0)
