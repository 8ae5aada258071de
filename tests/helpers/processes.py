"""Running a tool: as a subprocess, as a user would, or in this process (``run_script_here``)."""

import contextlib
import glob
import importlib.util
import io
import json
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch

from .paths import ROOT


def run(*cmd, ok=True, cwd=ROOT, env=None):
    """Run a command as a user would (from the repository root unless ``cwd``); assert that it
    succeeded (``ok``) or failed; return its output (standard output, then error)."""
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, env=env)
    log = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, log[-4000:]
    return log


def run_tool(*args, ok=True, cwd=ROOT, env=None):
    """``python ARGS`` (a script and its arguments), as ``run`` runs a command."""
    return run(sys.executable, *args, ok=ok, cwd=cwd, env=env)


def tool_process(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """``python ARGS`` from ``cwd``, whatever its exit code: for checks of the exit code and of
    what goes to standard error."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)


def assert_no_warnings(stderr: str):
    """Nothing on standard error is a Python warning. mmengine's ``pkg_resources`` import used
    to warn twice in every tool that reads a config (mmrepa.seams, item 0)."""
    assert not [line for line in stderr.splitlines() if 'Warning' in line], stderr[-3000:]


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def own_script(package: str, tool: str = 'test') -> str:
    """``tools/TOOL.py`` as the package ships it (``<package>/.mim/tools/TOOL.py``), the script
    ``mim TOOL`` runs."""
    module = __import__(package)
    script = osp.join(osp.dirname(module.__file__), '.mim', 'tools', f'{tool}.py')
    assert osp.exists(script), script
    return script


def written_metrics(work_dir: str) -> dict:
    """The metrics the runner's logger wrote for a test run in ``work_dir``
    (``<work_dir>/<timestamp>/<timestamp>.json``)."""
    files = glob.glob(osp.join(work_dir, '*', '*.json'))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return json.load(f)


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


def _managed_classes() -> list:
    """mmengine's process-wide named instances live in each ManagerMixin class (MMLogger,
    MessageHub, Visualizer and the libraries' visualizers): a tool run in this process leaves
    its own there, and the next run's hooks would take them as current."""
    from mmengine.utils import ManagerMixin

    classes, stack = [], [ManagerMixin]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in classes:
                classes.append(sub)
                stack.append(sub)
    return classes


@contextlib.contextmanager
def fresh_mmengine_instances():
    """Drop the named instances (loggers, with their handlers closed, message hubs,
    visualizers) created inside, so nothing after finds them as current."""
    from mmengine.logging import MMLogger

    before = {cls: set(cls._instance_dict) for cls in _managed_classes()}
    try:
        yield
    finally:
        for cls in _managed_classes():
            for name in set(cls._instance_dict) - before.get(cls, set()):
                instance = cls._instance_dict.pop(name, None)  # a dict may be inherited
                if isinstance(instance, MMLogger):
                    for handler in instance.handlers:
                        handler.close()


def run_script_here(script: str, *args, ok: bool = True, cwd: str = ROOT):
    """``python SCRIPT ARGS`` from ``cwd`` (the repository root) as ``run_tool`` runs it, but in
    this process, without the interpreter start and the imports (torch, mmengine, mmdet, ...) a
    subprocess pays: the script's ``main()`` with ``sys.argv`` as the interpreter sets it, its
    standard output and error captured. Asserts it succeeded (``ok``) or stopped with an error,
    as ``run_tool`` asserts the exit code; returns (what ``main`` returned, the output, with the
    message of a stop at the end).

    For tests whose point is what a tool computes, not its process; a check of what a user sees
    at the command line keeps a subprocess. Restored after the call: ``sys.argv``, the working
    directory, ``LOCAL_RANK`` (the runner scripts set it from ``--local_rank``) and the flushing
    of denormals (tools/benchmark.py turns it on; off is torch's default). The messages of a
    runner's logger are captured only if the runner created it: do not assert that something is
    absent from them without asserting something of the same run is present. The named instances
    the call created (loggers, with their handlers closed, message hubs, visualizers) are
    dropped after it, so the next call's runner creates its own even where its name (config
    name and second of the start) is the same, and its hooks never find an earlier run's."""
    out, value, code = io.StringIO(), None, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, 'argv', [osp.join(ROOT, script), *map(str, args)])
        mp.chdir(cwd)
        if 'LOCAL_RANK' in os.environ:
            mp.setenv('LOCAL_RANK', os.environ['LOCAL_RANK'])
        else:
            mp.delenv('LOCAL_RANK', raising=False)
        main = script_module(script).main
        try:
            with fresh_mmengine_instances():
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
