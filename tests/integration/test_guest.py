"""``import mmrepa`` is a good guest (issue 40, item 1): in a fresh interpreter that has already
imported what a host project imports (torch, mmengine, mmcv), it registers its types and changes
nothing else another project could notice, except its documented safety net (torch's allow-list
and mmengine's checkpoint schemes, mmrepa/seams.py), which ``MMREPA_RESTRICTED_LOAD=0`` turns
off. The excepthook and the warnings filter come only with the opt-in module."""

import json
import os
import subprocess
import sys

import pytest

# the process state a host could notice, as comparable text; run before and after the import
SNAPSHOT = r"""
import builtins, faulthandler, gc, json, logging, multiprocessing, os, random, signal, sys
import threading, warnings
import numpy as np
import torch
import mmcv, mmengine, mmengine.config, mmengine.model, mmengine.registry, mmengine.runner
from mmengine.runner.checkpoint import CheckpointLoader


def loggers():
    found = {'': logging.getLogger()}
    found.update(logging.Logger.manager.loggerDict)
    return {
        name: [logger.level, [repr(h) for h in logger.handlers], logger.propagate, logger.disabled]
        for name, logger in sorted(found.items())
        if isinstance(logger, logging.Logger) and not name.startswith('mmrepa')
    }


def signals():
    out = {}
    for sig in sorted(signal.valid_signals()):
        try:
            out[str(sig)] = repr(signal.getsignal(sig))
        except (ValueError, OSError):
            pass
    return out


def snapshot():
    state = dict(
        excepthook=repr(sys.excepthook),
        threading_excepthook=repr(threading.excepthook),
        unraisablehook=repr(sys.unraisablehook),
        displayhook=repr(sys.displayhook),
        showwarning=repr(warnings.showwarning),
        warnings_filters=repr(warnings.filters),
        path=list(sys.path),
        meta_path=[repr(type(f)) for f in sys.meta_path],
        path_hooks=[repr(h) for h in sys.path_hooks],
        environ=dict(os.environ),
        cwd=os.getcwd(),
        recursion=sys.getrecursionlimit(),
        switch=sys.getswitchinterval(),
        stdio=[repr(sys.stdout), repr(sys.stderr), repr(sys.stdin)],
        builtins=sorted(vars(builtins)),
        gc=[gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()],
        faulthandler=faulthandler.is_enabled(),
        start_method=multiprocessing.get_start_method(allow_none=True),
        signals=signals(),
        loggers=loggers(),
        logging_disable=logging.root.manager.disable,
        np_err=np.geterr(),
        np_print=repr(np.get_printoptions()),
        np_random=repr(np.random.get_state()[1][:8].tolist()),
        random=repr(random.getstate()[1][:8]),
        torch_rng=torch.get_rng_state()[:64].tolist(),
        dtype=str(torch.get_default_dtype()),
        threads=[torch.get_num_threads(), torch.get_num_interop_threads()],
        grad=torch.is_grad_enabled(),
        anomaly=torch.is_anomaly_enabled(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        matmul=torch.get_float32_matmul_precision(),
        cudnn=[torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic],
        mkldnn=torch.backends.mkldnn.enabled,
        # the safety net, documented: compared separately
        safe_globals=sorted(repr(g) for g in torch.serialization.get_safe_globals()),
        schemes=sorted(f'{p}:{l.__module__}' for p, l in CheckpointLoader._schemes.items()),
    )
    return json.loads(json.dumps(state, default=repr))


before = snapshot()
import mmrepa  # noqa: E402
after = snapshot()
print(json.dumps(dict(
    before=before,
    after=after,
    modules=sorted(m for m in sys.modules if m.startswith(('mmrepa.integrations', 'mmdet',
                                                           'mmseg', 'mmpretrain', 'mmrepa.apis'))),
)))
"""
SAFETY_NET = ('safe_globals', 'schemes')


def run(code: str, **env) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS='1', **env)
    env = {k: v for k, v in env.items() if v is not None}  # None: not set
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope='module', params=['on', 'off'])
def guest(request):
    switch = '0' if request.param == 'off' else None
    return request.param, run(SNAPSHOT, MMREPA_RESTRICTED_LOAD=switch)


def test_import_mmrepa_changes_nothing_outside_its_safety_net(guest):
    _, found = guest
    before, after = found['before'], found['after']
    changed = {k: (before[k], after[k]) for k in before if k not in SAFETY_NET}
    changed = {k: v for k, v in changed.items() if v[0] != v[1]}
    assert changed == {}, json.dumps(changed, indent=1)[:3000]
    assert found['modules'] == [], 'import mmrepa imports no tool glue and no downstream library'


def test_the_safety_net_and_its_switch(guest):
    switch, found = guest
    before, after = found['before'], found['after']
    if switch == 'off':  # MMREPA_RESTRICTED_LOAD=0: torch and mmengine as they were
        assert [after[k] for k in SAFETY_NET] == [before[k] for k in SAFETY_NET]
        return
    assert {s.rsplit(':', 1)[1] for s in after['schemes']} == {'mmrepa.checkpoint.schemes'}
    assert set(before['safe_globals']) < set(after['safe_globals'])


def test_the_opt_in_installs_the_tool_seams():
    """One config line (custom_imports=['mmrepa.one_line_errors']) gives another project's tools
    the excepthook and the warnings filter; plain ``import mmrepa`` does not."""
    code = (
        'import sys, warnings, json\n'
        'import mmrepa\n'
        'plain = [sys.excepthook is sys.__excepthook__, len(warnings.filters)]\n'
        'import mmrepa.one_line_errors\n'
        'print(json.dumps(dict(plain=plain, hook=sys.excepthook is not sys.__excepthook__,\n'
        '    filtered=any(f[1] and f[1].pattern.startswith("pkg_resources is deprecated")\n'
        '                 for f in warnings.filters),\n'
        '    tools=sorted(m for m in sys.modules if m.startswith("mmrepa.integrations")))))\n'
    )
    found = run(code)
    assert found['plain'][0] is True and found['hook'] and found['filtered']
    assert found['tools'] == []
