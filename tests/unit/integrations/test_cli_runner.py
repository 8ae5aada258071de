"""The tools' runner and their garbage-collector setting (mmrepa/integrations/cli/runner.py)."""

import gc

import pytest
from mmengine.runner import FlexibleRunner, Runner

from mmrepa.apis import load_config
from mmrepa.integrations.cli.args import one_line_errors
from mmrepa.integrations.cli.runner import build_runner
from tests.helpers import TINY_ARCH, tiny_classifier_config, write_images


@pytest.fixture
def unfrozen():
    """Nothing frozen when the test starts (the test worker froze what its modules loaded);
    frozen again afterwards, as the worker expects."""
    gc.unfreeze()
    yield
    gc.freeze()


def test_a_tool_main_starts_with_what_the_imports_made_frozen(unfrozen):
    @one_line_errors('tools/x.py')
    def main():
        return gc.get_freeze_count()

    assert gc.get_freeze_count() == 0
    assert main() > 0


@pytest.mark.parametrize('runner_type', [None, 'FlexibleRunner'])
def test_build_runner_builds_the_configs_runner_and_freezes_it(tmp_path, unfrozen, runner_type):
    data = write_images(str(tmp_path / 'data'), count=4)
    path = tiny_classifier_config(
        'repa_swin/repa_swin_t_32xb128_in1k.py', TINY_ARCH, data, str(tmp_path / 'tiny.py')
    )
    cfg = load_config(path)
    cfg.work_dir = str(tmp_path / 'work')
    if runner_type:
        cfg.runner_type = runner_type
    gc.unfreeze()
    runner = build_runner(cfg)
    assert type(runner) is (FlexibleRunner if runner_type else Runner)
    assert gc.get_freeze_count() > 0
