"""Fixtures, and the tier of each test: ``unit`` under tests/unit (mirrors the package; fast,
in this process), ``integration`` under tests/integration (tools as a user runs them, the
Runner, DDP, mmdeploy, the demo, the docs build). ``make test-fast`` runs the unit tier,
``make test`` both; ``-m unit`` / ``-m integration`` select a tier too. Shared functions are
in helpers.py."""

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
    library imported so far, one full collection takes ~1 s, and every Runner, tool run in
    process and pipeline built here builds one to three data sets of a few images (a quantize
    test alone, profiled on a loaded machine: 19 collections, 17 s of its 54 s). All it saves
    is memory a forked dataloader worker would copy, and the tests measure no memory: a no-op
    here, for the data set module only."""
    from mmengine.dataset import base_dataset

    base_dataset.gc = types.SimpleNamespace(collect=lambda generation=2: 0)


def pytest_configure(config):
    """The processes that run tests (one, or xdist's workers) parse configs once and skip
    mmengine's full collections. xdist's controller runs none: it does not even import torch
    or tests.helpers here (4-6 s before the workers start, when nothing else runs: 2-core AMD
    EPYC, AVX2, a one-file run with -n 2)."""
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
    automatic full collection walks all of it (~0.4 s; 14.5 s of test_runner + test_tools).
    What is alive when a module starts (libraries, session fixtures) is frozen: full
    collections walk what the tests create since (gen-2 time of those two files: 4.8 s). A
    cycle that dies later among frozen objects is not freed; a test process can afford that."""
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
