"""Heartbeat lines (mmrepa.utils.progress): one each time ``interval`` passes without a line,
none after stop, and the elapsed time written as people read it."""

import threading
import time

import pytest

from mmrepa.utils.progress import Heartbeat, elapsed, progress_interval


@pytest.mark.parametrize(
    'seconds, text',
    [(0, '0 s'), (59.9, '59 s'), (60, '1 min 00 s'), (185, '3 min 05 s'), (3720, '1 h 02 min')],
)
def test_elapsed(seconds, text):
    assert elapsed(seconds) == text


@pytest.mark.parametrize(
    'value, expected', [('5', 5.0), ('0.5', 0.5), ('abc', 30.0), ('0', 30.0), ('-2', 30.0)]
)
def test_the_interval_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', value)
    assert progress_interval() == expected
    monkeypatch.setenv('MMREPA_PROGRESS_INTERVAL', 'inf')
    assert progress_interval() == 30.0


def test_lines_come_an_interval_apart_and_stop_with_stop():
    interval, times, done = 0.05, [], threading.Event()

    def write(line):
        times.append(time.monotonic())
        if len(times) == 3:
            done.set()

    beat = Heartbeat(lambda: 'beat', write, interval=interval)
    start = time.monotonic()
    beat.start()
    assert done.wait(10)
    beat.stop()
    count = len(times)
    time.sleep(3 * interval)
    assert len(times) == count  # nothing after stop
    gaps = [b - a for a, b in zip([start, *times], times)]
    assert min(gaps) >= interval * 0.99, gaps  # never sooner than the interval
    assert not beat._thread.is_alive()


def test_touch_postpones_the_next_line():
    written = []
    with Heartbeat(lambda: 'beat', written.append, interval=0.5) as beat:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            beat.touch()
            time.sleep(0.02)
    assert written == []


def test_stop_from_the_writer_itself_does_not_wait_for_itself():
    written = []

    def write(line):
        written.append(line)
        beat.stop()  # joining its own thread would raise

    beat = Heartbeat(lambda: f'beat {len(written)}', write, interval=0.01).start()
    beat._thread.join(10)
    assert written == ['beat 0'] and not beat._thread.is_alive()
