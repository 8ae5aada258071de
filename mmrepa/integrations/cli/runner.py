"""The runner a tool builds, and what a tool process asks of Python's garbage collector.

A tool imports torch, mmengine and a codebase (mmdet, mmseg, mmpretrain): half a million objects
the collector tracks (torch, mmrepa and mmdet), alive until the tool exits. Its full collections
walk all of them: several while they are imported, at each dataset mmengine builds (it calls
``gc.collect()``), in ``torch.load``, at exit. :func:`freeze_loaded_objects` moves what exists to
the collector's permanent generation (``gc.freeze``), which it no longer walks: a tool's run
gets shorter (measured in docs/speed.md, "Overheads of the tools and the tests"). Python's
documentation also recommends it before forking (the DataLoader's workers), so that the workers'
collections do not write to the shared pages. Frozen objects are still freed by reference
counting; only cycles among them would stay.
"""

import gc

from mmengine.config import Config
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ...checkpoint.loading import refuse_wrong_dtypes


def freeze_loaded_objects() -> None:
    """Leave every object that exists now out of the garbage collector's future walks."""
    gc.freeze()


def build_runner(cfg: Config) -> Runner:
    """The config's runner (mmengine's ``Runner``, or its ``runner_type``, such as
    ``FlexibleRunner``) with a :class:`~mmrepa.engine.hooks.ProgressHook`, a model that refuses
    checkpoint tensors of another kind (:func:`~mmrepa.checkpoint.loading.refuse_wrong_dtypes`),
    and the model and modules that building it made frozen."""
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(isinstance(h, dict) and h.get('type') == 'ProgressHook' for h in hooks):
        cfg.custom_hooks = hooks + [dict(type='ProgressHook')]
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    if not hasattr(runner, 'strategy'):  # load_from, resume, a tool's CHECKPOINT (not FSDP's)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        refuse_wrong_dtypes(model, cfg.get('load_from') or 'the checkpoint')
    freeze_loaded_objects()
    return runner


def run(runner: Runner, loop: str):
    """``runner.train()`` / ``.test()`` / ``.val()``; its progress lines end with it, also when
    it raises (mmengine calls no hook then)."""
    from ...engine.hooks import ProgressHook

    try:
        return getattr(runner, loop)()
    finally:
        for hook in runner.hooks:
            if isinstance(hook, ProgressHook):
                hook.stop()
