import copy
import itertools
from typing import Dict, Optional

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ...fold import reparameterize
from ...utils.latency import time_interleaved


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _as_tuple(feats):
    return tuple(feats) if isinstance(feats, (list, tuple)) else (feats, )


@HOOKS.register_module()
class ReparameterizeHook(Hook):
    """Test the reparameterized (folded) model, optionally verifying it and timing both.

    At ``before_test_epoch`` the hook folds a copy of the model (after the checkpoint is
    loaded, and after ``EMAHook`` has swapped in the averaged weights: it runs at ``LOW``
    priority) and tests that copy; ``after_test_epoch`` puts the original back, so EMA's
    swap-back and anything after the test see the model they expect. Validation during
    training is never touched.

    Args:
        verify (bool): Compare backbone outputs of the original and the folded model on the
            first test batch and raise if they differ by more than ``tolerance`` (relative to
            the largest output magnitude). Default: True.
        tolerance (float): See ``verify``. Default: 1e-4.
        measure_latency (bool): Time ``test_step`` per image, original vs folded, interleaved
            on ``num_batches`` test batches after ``warmup`` untimed rounds; log the median.
            Default: False.
        num_batches (int): Test batches used for timing. Default: 10.
        warmup (int): Untimed rounds before timing. Default: 2.
    """

    priority = 'LOW'

    def __init__(self, verify: bool = True, tolerance: float = 1e-4,
                 measure_latency: bool = False, num_batches: int = 10, warmup: int = 2):
        self.verify = verify
        self.tolerance = tolerance
        self.measure_latency = measure_latency
        self.num_batches = num_batches
        self.warmup = warmup
        self._original: Optional[nn.Module] = None
        self.results: Dict[str, float] = {}

    def before_test_epoch(self, runner) -> None:
        wrapper = runner.model if is_model_wrapper(runner.model) else None
        model = wrapper.module if wrapper is not None else runner.model
        model.eval()
        folded = reparameterize(copy.deepcopy(model))
        self.results = dict(params_before=count_parameters(model),
                            params_after=count_parameters(folded))
        if self.verify or self.measure_latency:
            batches = list(itertools.islice(runner.test_dataloader,
                                            max(1, self.num_batches if self.measure_latency
                                                else 1)))
            if self.verify:
                self._verify(runner, model, folded, batches[0])
            if self.measure_latency:
                self._measure(runner, model, folded, batches)
        self._log_table(runner)
        self._original = model
        if wrapper is not None:
            wrapper.module = folded
        else:
            runner.model = folded

    def after_test_epoch(self, runner, metrics=None) -> None:
        if self._original is None:
            return
        if is_model_wrapper(runner.model):
            runner.model.module = self._original
        else:
            runner.model = self._original
        self._original = None

    @torch.no_grad()
    def _verify(self, runner, model, folded, batch) -> None:
        data = model.data_preprocessor(batch, False)
        ref = _as_tuple(model.backbone(data['inputs']))
        out = _as_tuple(folded.backbone(data['inputs']))
        scale = max(r.abs().max().item() for r in ref) or 1.0
        err = max((r - o).abs().max().item() for r, o in zip(ref, out)) / scale
        self.results['verify_rel_error'] = err
        if not err <= self.tolerance:
            raise RuntimeError(
                f'the folded model disagrees with the original: backbone outputs differ by '
                f'{err:.3e} (relative to their largest magnitude {scale:.3e}), more than '
                f'tolerance={self.tolerance:g}. A fold is wrong for this model; please report it.')
        runner.logger.info(f'ReparameterizeHook: folded backbone verified on a test batch, '
                           f'max relative error {err:.2e}')

    @torch.no_grad()
    def _measure(self, runner, model, folded, batches) -> None:
        device = next(model.parameters()).device

        def one_batch_at_a_time(m):
            it = itertools.cycle(batches)
            return lambda: m.test_step(next(it))  # round r: batch r for both variants

        def progress(done, total):
            if done % max(1, total // 5) == 0 or done == total:
                runner.logger.info(f'ReparameterizeHook: timed {done}/{total} test batches')

        stats = time_interleaved(
            dict(before=one_batch_at_a_time(model), after=one_batch_at_a_time(folded)),
            repeat=len(batches), warmup=self.warmup, device=device, progress=progress)
        per_batch = len(batches[0]['inputs'])
        before, after = stats['before'].median / per_batch, stats['after'].median / per_batch
        self.results.update(ms_per_image_before=before, ms_per_image_after=after,
                            change_percent=100.0 * (after - before) / before)

    def _log_table(self, runner) -> None:
        r = self.results
        rows = [('parameters (M)', f"{r['params_before'] / 1e6:.2f}",
                 f"{r['params_after'] / 1e6:.2f}",
                 f"{100.0 * (r['params_after'] - r['params_before']) / r['params_before']:+.1f} %")]
        if 'ms_per_image_before' in r:
            rows.insert(0, ('test_step ms / image', f"{r['ms_per_image_before']:.1f}",
                            f"{r['ms_per_image_after']:.1f}", f"{r['change_percent']:+.1f} %"))
        lines = [f"{'':<22}{'before':>10}{'after':>10}{'change':>10}"]
        lines += [f'{a:<22}{b:>10}{c:>10}{d:>10}' for a, b, c, d in rows]
        runner.logger.info('ReparameterizeHook: reparameterized the model for testing\n' +
                           '\n'.join(lines))
