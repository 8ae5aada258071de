"""Progress lines for long runs: a line at least every ``interval`` seconds while work goes on.

A CPU run can spend minutes in one step (an export, a calibration, one iteration of a large
detector) without a line, and a user cannot tell it from a hang. :class:`Heartbeat` writes a
line from a thread whenever nothing was written for ``interval`` seconds (torch releases the
interpreter lock in its kernels, so the thread runs while a long operation does).
``MMREPA_PROGRESS_INTERVAL`` (seconds) changes the default of 30.
"""

import os
import sys
import threading
import time
from typing import Callable, Optional

DEFAULT_INTERVAL = 30.0


def progress_interval() -> float:
    """``MMREPA_PROGRESS_INTERVAL`` if it is a positive number of seconds, else 30."""
    try:
        interval = float(os.environ.get('MMREPA_PROGRESS_INTERVAL', DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return interval if 0 < interval < float('inf') else DEFAULT_INTERVAL


def elapsed(seconds: float) -> str:
    """``'45 s'``, ``'3 min 05 s'``, ``'1 h 02 min'``."""
    seconds = int(seconds)
    if seconds < 60:
        return f'{seconds} s'
    if seconds < 3600:
        return f'{seconds // 60} min {seconds % 60:02d} s'
    return f'{seconds // 3600} h {seconds % 3600 // 60:02d} min'


class Heartbeat:
    """Calls ``write(message())`` from a thread each time ``interval`` seconds pass without a
    line (its own, or one announced with :meth:`touch`), between :meth:`start` and
    :meth:`stop` (or as a context manager)."""

    def __init__(
        self,
        message: Callable[[], str],
        write: Callable[[str], None],
        interval: Optional[float] = None,
    ):
        self.message, self.write = message, write
        self.interval = interval or progress_interval()
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def touch(self) -> None:
        """A line was just written elsewhere: the next one is due ``interval`` from now."""
        self._last = time.monotonic()

    def start(self) -> 'Heartbeat':
        self.touch()
        self._thread = threading.Thread(target=self._run, name='mmrepa-progress', daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> 'Heartbeat':
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopped.wait(max(0.0, self._last + self.interval - time.monotonic())):
            if time.monotonic() - self._last >= self.interval:
                self.touch()
                self.write(self.message())


def step(tool: str, what: str) -> Heartbeat:
    """A heartbeat for one step of a tool: ``TOOL: WHAT (running for 45 s)`` on stderr."""
    start = time.monotonic()

    def message() -> str:
        return f'{tool}: {what} (running for {elapsed(time.monotonic() - start)})'

    return Heartbeat(message, lambda line: print(line, file=sys.stderr, flush=True))
