import copy
import itertools
import statistics
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner.amp import autocast

from ...fold import fold_model
from ...utils.latency import time_interleaved
from .sharding import is_sharded


def _device_of(model: nn.Module) -> torch.device:
    t = next(itertools.chain(model.parameters(), model.buffers()), None)
    return t.device if t is not None else torch.device('cpu')


def _move(model: nn.Module, device: torch.device) -> None:
    model.to(device)


def _tensors(out, path: str = 'output') -> Iterator[Tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor in nested tuples, lists and dicts, in order."""
    if isinstance(out, torch.Tensor):
        yield path, out
    elif isinstance(out, dict):
        for k in sorted(out, key=str):
            yield from _tensors(out[k], f'{path}[{k!r}]')
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            yield from _tensors(v, f'{path}[{i}]')


def _outputs(model: nn.Module, data: dict, shared: dict):
    """The model's outputs in tensor mode. For a two-stage detector: its RPN's outputs and its
    RoI head's outputs on the proposals the first call (the original model) selected, kept in
    ``shared``: selecting proposals is discrete, so rounding-level differences could pick
    others and make the RoI outputs incomparable."""
    if getattr(model, 'with_rpn', False) and hasattr(model, 'roi_head'):
        x = model.extract_feat(data['inputs'])
        if 'proposals' not in shared:
            shared['proposals'] = model.rpn_head.predict(x, data['data_samples'], rescale=False)
        proposals = copy.deepcopy(shared['proposals'])
        return model.rpn_head(x), model.roi_head.forward(x, proposals, data['data_samples'])
    return model(**data, mode='tensor')


def _batch_size(batch) -> int:
    inputs = batch['inputs'] if isinstance(batch, dict) else batch
    return len(inputs)


@HOOKS.register_module()
class ReparameterizeHook(Hook):
    """Test the reparameterized (folded) model, optionally verifying it and timing both.

    At ``before_test_epoch`` the hook folds a copy of the model (after the checkpoint is
    loaded, and after ``EMAHook`` has swapped in the averaged weights: it runs at ``LOW``
    priority) and tests that copy; ``after_test_epoch`` puts the original back, so EMA's
    swap-back and anything after the test see the model they expect. When the test fails
    part-way no hook runs: with ``test_cfg = dict(type='FoldedTestLoop')``
    (:class:`mmrepa.engine.FoldedTestLoop`, as ``tools/test.py --reparam`` sets it) the
    original comes back then too; with mmengine's ``TestLoop`` ``runner.model`` stays the
    folded copy (as mmengine's ``EMAHook`` leaves the averaged weights). While the
    copy is tested the original waits on the CPU, so an accelerator holds one model only.
    Validation during training is never touched. A sharded model (``FoldableFSDPStrategy``
    on ``FlexibleRunner``) is gathered into an unsharded copy on every rank
    (``strategy.full_model()``), which is folded, verified and tested; the sharded model is
    not changed and is back in ``runner.model`` after the test.

    Args:
        verify (bool): Compare the whole model's outputs (``mode='tensor'``: e.g. a detector's
            head outputs, a segmentor's logits; a two-stage detector's RPN outputs and RoI
            head outputs on the original's proposals) of the original and the folded model on
            the first test batch and raise if any output tensor differs by more than
            ``tolerance`` relative to that tensor's largest magnitude (at least 1e-3 of the
            largest output's). Default: True.
        tolerance (float): See ``verify``. Default: 1e-4.
        measure_latency (bool): Time ``test_step``, original vs folded, interleaved on
            ``num_batches`` test batches after ``warmup`` untimed rounds; log the median time
            per image (each batch's time divided by its own size). Under the test loop's
            autocast when it has one (``test_cfg = dict(type='TestLoop', fp16=True)``), as the
            test runs; ``verify`` compares without it (the fold itself). Default: False.
        num_batches (int): Test batches used for timing. Default: 10.
        warmup (int): Untimed rounds before timing. Default: 2.
    """

    priority = 'LOW'

    def __init__(
        self,
        verify: bool = True,
        tolerance: float = 1e-4,
        measure_latency: bool = False,
        num_batches: int = 10,
        warmup: int = 2,
    ):
        self.verify = verify
        self.tolerance = tolerance
        self.measure_latency = measure_latency
        self.num_batches = num_batches
        self.warmup = warmup
        self._original: Optional[nn.Module] = None
        self._original_device: Optional[torch.device] = None
        self._sharded: Optional[nn.Module] = None  # the FSDP model while its copy is tested
        self.results: Dict[str, float] = {}

    def before_test_epoch(self, runner) -> None:
        wrapper = runner.model if is_model_wrapper(runner.model) else None
        model = wrapper.module if wrapper is not None else runner.model
        if is_sharded(wrapper):  # fold an unsharded copy; the shards stay as they are
            self._sharded, wrapper = wrapper, None
            model = runner.strategy.full_model()
        model.eval()
        report = fold_model(copy.deepcopy(model), logger=None)
        folded = report.model
        self.results = dict(
            params_before=report.params_before,
            params_after=report.params_after,
            folded=report.folded,
            not_folded=report.unfolded,
        )
        if self.verify or self.measure_latency:
            batches = list(
                itertools.islice(
                    runner.test_dataloader, max(1, self.num_batches if self.measure_latency else 1)
                )
            )
            if self.verify:
                self._verify(runner, model, folded, batches[0])
            if self.measure_latency:
                self._measure(runner, model, folded, batches)
        self._log_table(runner)
        if self._sharded is not None:
            runner.model = folded
            return
        self._original = model
        self._original_device = _device_of(model)
        if self._original_device.type != 'cpu':
            _move(model, torch.device('cpu'))
        if wrapper is not None:
            wrapper.module = folded
        else:
            runner.model = folded

    def after_test_epoch(self, runner, metrics=None) -> None:
        self.restore(runner)

    def restore(self, runner) -> None:
        """Put the original model back (a no-op when it is in place)."""
        if self._sharded is not None:
            runner.model, self._sharded = self._sharded, None
            return
        if self._original is None:
            return
        original, self._original = self._original, None
        if self._original_device is not None and self._original_device.type != 'cpu':
            _move(original, self._original_device)
        if is_model_wrapper(runner.model):
            runner.model.module = original
        else:
            runner.model = original

    @torch.no_grad()
    def _verify(self, runner, model, folded, batch) -> None:
        data = model.data_preprocessor(copy.deepcopy(batch), False)
        shared = {}
        try:
            ref = _outputs(model, data, shared)
        except NotImplementedError:  # a model without a tensor mode: its backbone at least
            runner.logger.warning(
                'ReparameterizeHook: the model has no tensor mode; verifying '
                'the backbone outputs only'
            )
            ref, out = model.backbone(data['inputs']), folded.backbone(data['inputs'])
        else:
            out = _outputs(folded, data, shared)
        ref, out = list(_tensors(ref)), list(_tensors(out))
        if [(p, r.shape) for p, r in ref] != [(p, o.shape) for p, o in out]:
            raise RuntimeError(
                'the folded model disagrees with the original: its outputs have '
                'another structure or shape. A fold is wrong for this model; '
                'please report it.'
            )
        ref = [(p, r.detach().double()) for p, r in ref if r.numel()]
        out = [o.detach().double() for p, o in out if o.numel()]
        largest = max((r.abs().max().item() for _, r in ref), default=0.0)
        errors = []
        for (path, r), o in zip(ref, out):
            # each tensor relative to its own largest magnitude, so that small outputs (box
            # deltas next to class logits) are checked as strictly as large ones; not below
            # 1e-3 of the largest output, whose rounding errors reach the tiny ones
            scale = max(r.abs().max().item(), 1e-3 * largest) or 1.0
            errors.append(((r - o).abs().max().item() / scale, path, scale))
        err, worst, worst_scale = max(
            errors, key=lambda e: e[0] if e[0] == e[0] else float('inf'), default=(0.0, None, 0.0)
        )  # NaN is worst
        self.results['verify_rel_error'] = err
        if not err <= self.tolerance:
            raise RuntimeError(
                f'the folded model disagrees with the original: {worst} differs by {err:.3e} '
                f'(relative to its magnitude {worst_scale:.3e}), more than '
                f'tolerance={self.tolerance:g}. A fold is wrong for this model; please report it.'
            )
        runner.logger.info(
            f'ReparameterizeHook: folded model verified on a test batch '
            f'({len(ref)} output tensors), max relative error {err:.2e}'
        )

    @torch.no_grad()
    def _measure(self, runner, model, folded, batches) -> None:
        device = _device_of(model)
        sizes = {'before': [], 'after': []}
        # TestLoop(fp16=True) runs test_step under mmengine's autocast: time it so too
        fp16 = bool(getattr(getattr(runner, 'test_loop', None), 'fp16', False))

        def one_batch_at_a_time(name, m):
            it = itertools.cycle(batches)

            def call():
                batch = next(it)
                sizes[name].append(_batch_size(batch))
                with autocast(enabled=fp16):
                    return m.test_step(batch)

            return call

        def progress(done, total):
            if done % max(1, total // 5) == 0 or done == total:
                runner.logger.info(f'ReparameterizeHook: timed {done}/{total} test batches')

        stats = time_interleaved(
            dict(
                before=one_batch_at_a_time('before', model),
                after=one_batch_at_a_time('after', folded),
            ),
            repeat=len(batches),
            warmup=self.warmup,
            device=device,
            progress=progress,
        )
        per_image = {}
        for name, s in stats.items():
            timed = sizes[name][-len(s.samples) :]  # the warmup calls came first
            per_image[name] = statistics.median([t / n for t, n in zip(s.samples, timed)])
        before, after = per_image['before'], per_image['after']
        self.results.update(
            ms_per_image_before=before,
            ms_per_image_after=after,
            change_percent=100.0 * (after - before) / before,
            autocast=fp16,
        )

    def _log_table(self, runner) -> None:
        r = self.results
        rows = [
            (
                'parameters (M)',
                f'{r["params_before"] / 1e6:.2f}',
                f'{r["params_after"] / 1e6:.2f}',
                f'{100.0 * (r["params_after"] - r["params_before"]) / r["params_before"]:+.1f} %',
            )
        ]
        if 'ms_per_image_before' in r:
            rows.insert(
                0,
                (
                    'test_step ms/img, amp' if r['autocast'] else 'test_step ms / image',
                    f'{r["ms_per_image_before"]:.1f}',
                    f'{r["ms_per_image_after"]:.1f}',
                    f'{r["change_percent"]:+.1f} %',
                ),
            )
        lines = [f'{"":<22}{"before":>10}{"after":>10}{"change":>10}']
        lines += [f'{a:<22}{b:>10}{c:>10}{d:>10}' for a, b, c, d in rows]
        lines += [f'folded {n} x {kind}' for kind, n in sorted(r['folded'].items())]
        runner.logger.info(
            'ReparameterizeHook: reparameterized the model for testing\n' + '\n'.join(lines)
        )
        if r['not_folded']:
            runner.logger.warning(
                'ReparameterizeHook: these modules may not be folded: ' + '; '.join(r['not_folded'])
            )
