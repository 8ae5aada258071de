"""Fixtures, and the tier of each test: ``unit`` under tests/unit (mirrors the package; fast,
in this process), ``integration`` under tests/integration (tools as a user runs them, the
Runner, DDP, mmdeploy, the demo, the docs build). ``make test-fast`` runs the unit tier,
``make test`` both; ``-m unit`` / ``-m integration`` select a tier too. Across them, the tests
marked ``cuda`` (``make test-cuda``) run on the GPU through the ``device`` fixture, and the run
ends with a line that counts them apart. Shared functions are in the helpers/ package."""

import collections
import contextlib
import fcntl
import gc
import os
import os.path as osp
import types

import pytest

TIERS = ('unit', 'integration')


def _no_full_collection_per_dataset():
    """mmengine's ``BaseDataset`` runs ``gc.collect()`` after serializing its annotations (to
    free the list before dataloader workers fork). In a test worker whose heap holds every
    library imported so far, one full collection is slow, and every Runner, tool run in
    process and pipeline built here builds one to three data sets of a few images (the cost:
    docs/speed.md, "Overheads of the tools and the tests"). All it saves is memory a forked
    dataloader worker would copy, and the tests measure no memory: a no-op here, for the data
    set module only."""
    from mmengine.dataset import base_dataset

    base_dataset.gc = types.SimpleNamespace(collect=lambda generation=2: 0)


def pytest_configure(config):
    """The processes that run tests (one, or xdist's workers) parse configs once and skip
    mmengine's full collections. xdist's controller runs none: it does not even import torch
    or tests.helpers here (seconds before the workers start, when nothing else runs)."""
    if getattr(config.option, 'numprocesses', None) and not hasattr(config, 'workerinput'):
        return
    from tests.helpers import memoize_config_parsing

    memoize_config_parsing()
    _no_full_collection_per_dataset()


# The longest files first. `make test` runs whole files on 2 workers (--dist loadfile): a long
# file handed out last keeps one worker busy while the other has nothing left to do.
LONGEST_FIRST = (
    'test_fsdp.py',
    'test_demo_smoke.py',
    'test_tools.py',
    'test_mmdeploy.py',
    'test_hostile_checkpoints.py',
    'test_distributed.py',
    'test_downstream_tools.py',
    'test_runner.py',
    'test_quantize.py',
    'test_configs_others.py',
    'test_configs_plain.py',
    'test_pretrain_handoff.py',
    'test_configs_metaformer.py',
    'test_tool_environment.py',
    'test_tool_inputs.py',
    'test_configs_repa_swin.py',
    'test_inference.py',
    'test_model_index.py',
    'test_backbone_tools.py',
    'test_repa_vit.py',
)


def pytest_collection_modifyitems(items):
    here = osp.dirname(osp.abspath(__file__))
    for item in items:
        tier = osp.relpath(str(item.path), here).split(osp.sep)[0]
        if tier not in TIERS:  # a tier is where a file is: a new file picks one
            raise pytest.UsageError(
                f'{item.nodeid}: put test files under tests/unit or tests/integration'
            )
        item.add_marker(getattr(pytest.mark, tier))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


@pytest.fixture(autouse=True, scope='module')
def _old_objects_out_of_full_collections():
    """A worker's heap holds every library imported so far (millions of objects), and each
    automatic full collection walks all of it (measured in docs/speed.md, "Overheads of the
    tools and the tests"). What is alive when a module starts (libraries, session fixtures) is
    frozen: full collections walk what the tests create since. A cycle that dies later among
    frozen objects is not freed; a test process can afford that."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True, scope='module')
def _module_mmengine_instances():
    """What a module fixture's Runner left (a logger, a visualizer of the config's name and
    second) is dropped with the module: a later module's runner of the same name would take
    it instead of building its own (mmdet's hook then got a plain mmengine Visualizer)."""
    from tests.helpers import fresh_mmengine_instances

    with fresh_mmengine_instances():
        yield


@pytest.fixture(autouse=True)
def _seed():
    import torch

    from tests.helpers import fresh_mmengine_instances

    torch.manual_seed(0)
    # a Runner built in a test leaves its logger, message hub and visualizer as mmengine's
    # current ones; a later runner's hooks in the same worker must not find them
    with fresh_mmengine_instances():
        yield
    # tools/benchmark.py's main() (called directly by test_benchmark_*.py) flushes denormals;
    # a later test in the same worker (hypothesis refuses to run then) gets torch's default back
    torch.set_flush_denormal(False)


@contextlib.contextmanager
def _built_once(tmp_path_factory, name):
    """A folder for ``name`` shared by the run's xdist workers, and whether it still has to be
    built: the first worker builds it under a file lock, the others wait and reuse it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):  # each worker's base is inside the run's
        base = base.parent
    folder = base / name
    with open(base / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / 'done'
        yield folder, not done.exists()
        done.touch()


@pytest.fixture(scope='session')
def demo_detector(tmp_path_factory):
    """The demo RetinaNet trained by mmengine's Runner for 2 epochs of 2 iterations on a
    generated shapes set (8 training images, 4 validation, 64 px): (data root ending in '/',
    {epoch: checkpoint}). Trained once per run for every module that needs a trained detector
    (tools, quantization, the Runner); read-only for them."""
    from mmengine.runner import Runner

    from mmrepa.datasets import make_shapes_coco
    from tests.helpers import demo_cfg

    with _built_once(tmp_path_factory, 'demo_detector') as (base, build):
        data_root = str(base / 'data') + '/'
        work_dir = str(base / 'train')
        if build:
            make_shapes_coco(str(base / 'data'), num_train=8, num_val=4, size=64)
            cfg = demo_cfg(data_root, work_dir)
            cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=2)  # both epochs
            runner = Runner.from_cfg(cfg)
            runner.train()
            # validation during training saw the unfolded model and left it unfolded
            assert hasattr(runner.model.backbone.stages[0].blocks[0].ffn, 'fc1')
    return data_root, {epoch: osp.join(work_dir, f'epoch_{epoch}.pth') for epoch in (1, 2)}


# ------------------------------------------------------------------- the cuda tier (-m cuda)

CUDA_TIER_SKIP = 'needs CUDA (or MMREPA_TEST_DEVICE=cpu)'
_cuda_tier = {}  # nodeid -> (outcome, device or None), for the summary line


@pytest.fixture
def device(request):
    """Where a test marked ``cuda`` runs: 'cuda' when torch has CUDA; else 'cpu' when
    ``MMREPA_TEST_DEVICE=cpu`` (the same tests forced onto the CPU, so that their code is not
    untested here); else the test is skipped. ``MMREPA_TEST_DEVICE=cuda`` makes CUDA required:
    without it the tests fail instead of skipping (a GPU job whose torch lost CUDA)."""
    import torch

    wanted = os.environ.get('MMREPA_TEST_DEVICE', '')
    if wanted not in ('', 'cpu', 'cuda'):
        pytest.fail(f"MMREPA_TEST_DEVICE must be 'cpu', 'cuda' or unset, got {wanted!r}")
    if torch.cuda.is_available():
        found = 'cuda'
    elif wanted == 'cuda':
        pytest.fail(
            f'MMREPA_TEST_DEVICE=cuda, but torch {torch.__version__} finds no CUDA device '
            f'(built for CUDA {torch.version.cuda})'
        )
    elif wanted == 'cpu':
        found = 'cpu'
    else:
        pytest.skip(CUDA_TIER_SKIP)
    request.node.user_properties.append(('cuda_tier_device', found))
    return torch.device(found)


def pytest_runtest_logreport(report):
    if 'cuda' not in report.keywords:
        return
    outcome, where = _cuda_tier.get(report.nodeid, ('passed', None))
    where = dict(report.user_properties).get('cuda_tier_device', where)
    if report.failed and outcome != 'failed':
        outcome = 'failed' if report.when == 'call' else 'error'
    elif report.skipped and outcome == 'passed':
        outcome = 'skipped'
    _cuda_tier[report.nodeid] = (outcome, where)


def pytest_terminal_summary(terminalreporter):
    """'cuda tier: 11 passed on cuda' / '11 skipped (no CUDA)' / '9 passed, 2 skipped on cpu
    (forced)': what ran of the tier, and where (under xdist too: the reports carry both)."""
    if not _cuda_tier:
        return
    counts = collections.Counter(outcome for outcome, _ in _cuda_tier.values())
    said = ', '.join(
        f'{counts[o]} {o}' for o in ('passed', 'failed', 'error', 'skipped') if counts[o]
    )
    where = {w for _, w in _cuda_tier.values() if w}
    place = (
        '(no CUDA)'
        if not where
        else 'on cuda'
        if where == {'cuda'}
        else 'on cpu (forced)'
        if where == {'cpu'}
        else 'on ' + ' and '.join(sorted(where))
    )
    terminalreporter.write_line(f'cuda tier: {said} {place}')
