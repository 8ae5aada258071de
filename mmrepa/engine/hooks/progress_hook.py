"""A progress line at least every 30 s of a run, however long its iterations or epochs.

mmengine's ``LoggerHook`` logs every ``interval`` iterations (50 in most configs) and at the end
of an epoch: on a CPU, a detector's iteration can take a minute and a small data set's epoch has
fewer iterations than the interval, so a run can be silent for many minutes.
"""

import datetime
import time
from typing import Optional

from mmengine.hooks import Hook, LoggerHook
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

from ...utils.progress import Heartbeat, elapsed


@HOOKS.register_module()
class ProgressHook(Hook):
    """Logs where the run is (``Epoch(train) [2][3/30]``), the ETA and how long the current
    iteration has been running, whenever ``interval`` seconds (default: 30, or
    ``MMREPA_PROGRESS_INTERVAL``) passed without a line of its own or of the ``LoggerHook``;
    and one line as each loop starts, with its size. Our tools add it to every run."""

    priority = 'VERY_LOW'  # after LoggerHook, to know whether it just logged
    _STATE = ('_mode', '_total', '_done', '_epoch', '_loop_start', '_loop_done')

    def __init__(self, interval: Optional[float] = None):
        self.interval = interval
        self._heartbeat: Optional[Heartbeat] = None
        self._saved, self._runner_iters, self._logger_interval = None, None, None
        self._where(None, 0, 0)  # no loop yet: before_train / before_test hooks run (a fold)

    # ---------------------------------------------------------------- the state the line shows

    def _where(
        self, mode: Optional[str], total: int, done: int, epoch: Optional[int] = None
    ) -> None:
        self._mode, self._total, self._done, self._epoch = mode, total, done, epoch
        self._loop_start = self._iter_start = time.monotonic()
        self._loop_done = 0

    def line(self) -> str:
        """The progress line of now."""
        if self._mode is None:
            return f'preparing the run for {elapsed(time.monotonic() - self._loop_start)}'
        epoch = f'[{self._epoch}]' if self._epoch is not None else ''
        kind = 'Iter' if self._mode == 'train' and self._epoch is None else 'Epoch'
        head = f'{kind}({self._mode}) {epoch}[{self._done}/{self._total}]'
        now = time.monotonic()
        if self._done >= self._total > 0:  # evaluating, or saving a checkpoint between epochs
            after = 'evaluating' if self._mode != 'train' else 'after the last iteration'
            return f'{head}  {after} for {elapsed(now - self._iter_start)}'
        parts = [head]
        if self._loop_done:
            per_iter = (self._iter_start - self._loop_start) / self._loop_done
            eta = datetime.timedelta(seconds=int(per_iter * (self._remaining() - 1)))
            parts += [f'eta: {eta}', f'time: {per_iter:.2f} s/iter']
        parts.append(f'iteration {self._done + 1} running for {elapsed(now - self._iter_start)}')
        return '  '.join(parts)

    def _remaining(self) -> int:
        """Iterations left, the current one included (training: of the whole run)."""
        if self._mode == 'train' and self._runner_iters is not None:
            return self._runner_iters[1] - self._runner_iters[0]
        return self._total - self._done

    # ---------------------------------------------------------------------------- the run

    def before_run(self, runner) -> None:
        loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]
        self._logger_interval = loggers[0].interval if loggers else None
        self._where(None, 0, 0)
        self._heartbeat = Heartbeat(self.line, runner.logger.info, self.interval).start()

    def after_run(self, runner) -> None:
        self.stop()

    def stop(self) -> None:
        """End the heartbeat (also for a run that raised: our tools call this then)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def _announce(self, runner, line: str) -> None:
        runner.logger.info(line)
        if self._heartbeat is not None:
            self._heartbeat.touch()

    def _after_iter(self, runner, batch_idx: int) -> None:
        self._done, self._loop_done = self._done + 1, self._loop_done + 1
        self._iter_start = time.monotonic()
        if self._mode == 'train' and self._runner_iters is not None:
            self._runner_iters = (runner.iter + 1, runner.max_iters)
        logged = self._logger_interval and (batch_idx + 1) % self._logger_interval == 0
        if (logged or self._done >= self._total) and self._heartbeat is not None:
            self._heartbeat.touch()

    # --------------------------------------------------------------------------- training

    def before_train(self, runner) -> None:
        loop = runner.train_loop
        if isinstance(loop, IterBasedTrainLoop):
            self._where('train', runner.max_iters, runner.iter)
            size = f'{runner.max_iters} iterations'
        else:
            size = f'{runner.max_epochs} epochs of {len(loop.dataloader)} iterations'
        self._runner_iters = (runner.iter, runner.max_iters)
        self._announce(runner, f'training: {size}, from iteration {runner.iter + 1}')

    def before_train_epoch(self, runner) -> None:
        if not isinstance(runner.train_loop, IterBasedTrainLoop):
            self._where('train', len(runner.train_loop.dataloader), 0, runner.epoch + 1)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._iter_start = time.monotonic()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._after_iter(runner, batch_idx)

    # ------------------------------------------------------------------ validation, testing

    def _before_eval(self, runner, mode: str) -> None:
        self._saved = {k: getattr(self, k) for k in self._STATE}
        total = len(getattr(runner, f'{mode}_loop').dataloader)
        epoch = runner.epoch if mode == 'val' and self._epoch is not None else None
        self._where(mode, total, 0, epoch)
        self._announce(runner, f'{mode}: {total} iterations')

    def _after_eval(self) -> None:
        """Back to training's state; the time spent evaluating does not count in its rate."""
        if self._saved is not None:
            paused = time.monotonic() - self._loop_start
            self.__dict__.update(self._saved)
            self._loop_start += paused
            self._iter_start, self._saved = time.monotonic(), None

    def before_val_epoch(self, runner) -> None:
        self._before_eval(runner, 'val')

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._after_iter(runner, batch_idx)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._after_eval()

    def before_test_epoch(self, runner) -> None:
        self._before_eval(runner, 'test')

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._after_iter(runner, batch_idx)

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._after_eval()
