"""Fixtures, and the tier of each test: ``unit`` under tests/unit (mirrors the package; fast,
in this process), ``integration`` under tests/integration (tools as a user runs them, the
Runner, DDP, mmdeploy, the demo, the docs build). ``make test-fast`` runs the unit tier,
``make test`` both; ``-m unit`` / ``-m integration`` select a tier too. Shared functions are
in helpers.py."""

import os.path as osp

import pytest
import torch

TIERS = ('unit', 'integration')


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
