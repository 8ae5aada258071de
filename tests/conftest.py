import contextlib
import importlib.util
import io
import os
import os.path as osp
import sys

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

# A small RePa-Swin that still has every structural feature (shifted blocks, 4 stages).
TINY_ARCH = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere and non-trivial BN statistics, so no fold term is invisible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.25)
                if m.weight is not None:
                    m.weight.copy_(1 + torch.randn(m.weight.shape, generator=g) * 0.2)
    return model


def shapes_cfg_options(data: str) -> list:
    """``--cfg-options`` that point the demo detector config at a generated shapes set in
    ``data`` (ending in '/'), without worker processes; an untrained detector still detects."""
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [
            f'{loader}.dataset.data_root={data}',
            f'{loader}.num_workers=0',
            f'{loader}.persistent_workers=False',
        ]
    for ev in ('val_evaluator', 'test_evaluator'):
        options.append(f'{ev}.ann_file={data}annotations/val.json')
    options.append('model.test_cfg.score_thr=0.0')
    return options


def max_abs_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    return (a - b).abs().max().item()


# The longest files first. `make test` runs whole files on 2 workers (--dist loadfile): a long
# file handed out last keeps one worker busy while the other has nothing left to do.
LONGEST_FIRST = (
    'test_configs.py',
    'test_tools.py',
    'test_distributed.py',
    'test_mmdeploy.py',
    'test_demo_smoke.py',
    'test_runner.py',
    'test_downstream_tools.py',
    'test_depth_rep_vit.py',
    'test_pretrain_handoff.py',
    'test_quantize.py',
    'test_inference.py',
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------- running a tool in this process

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
_SCRIPTS = {}


def script_module(script: str):
    """The script (``tools/train.py``, or a package's ``.mim/tools/test.py``) as a module, loaded
    once per process; its ``if __name__ == '__main__'`` block does not run."""
    path = osp.join(ROOT, script)
    if path not in _SCRIPTS:
        name = '_script_' + osp.splitext(osp.relpath(path, ROOT))[0].replace(os.sep, '_')
        spec = importlib.util.spec_from_file_location(name.replace('.', '_'), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


def run_script_here(script: str, *args, ok: bool = True):
    """``python SCRIPT ARGS`` from the repository root as ``run_tool`` runs it, but in this
    process, without the interpreter start and the imports (torch, mmengine, mmdet, ...) a
    subprocess pays: the script's ``main()`` with ``sys.argv`` as the interpreter sets it, its
    standard output and error captured. Asserts it succeeded (``ok``) or stopped with an error,
    as ``run_tool`` asserts the exit code; returns (what ``main`` returned, the output, with the
    message of a stop at the end).

    For tests whose point is what a tool computes, not its process; a check of what a user sees
    at the command line keeps a subprocess. Restored after the call: ``sys.argv``, the working
    directory, ``LOCAL_RANK`` (the runner scripts set it from ``--local_rank``) and the flushing
    of denormals (tools/benchmark.py turns it on; off is torch's default). The messages of a
    runner's logger are captured only if the runner created it: do not assert that something is
    absent from them without asserting something of the same run is present."""
    out, value, code = io.StringIO(), None, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, 'argv', [osp.join(ROOT, script), *map(str, args)])
        mp.chdir(ROOT)
        if 'LOCAL_RANK' in os.environ:
            mp.setenv('LOCAL_RANK', os.environ['LOCAL_RANK'])
        else:
            mp.delenv('LOCAL_RANK', raising=False)
        main = script_module(script).main
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                value = main()
        except SystemExit as stop:  # as the interpreter turns it into an exit code
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                out.write(f'{stop.code}\n')
        except BaseException:  # the script's output, shown with the failure
            sys.stdout.write(out.getvalue()[-4000:])
            raise
        finally:
            torch.set_flush_denormal(False)
    log = out.getvalue()
    assert (code == 0) == ok, log[-4000:]
    return value, log
