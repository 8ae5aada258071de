"""Every config in configs/depth_rep_vit/, repa_vit/, prepbn_vit/ and mlp_mixer/ (the plain,
isotropic backbones) builds, and its model runs one loss step and one predict step on a small
input (config_checks.check_config)."""

import pytest

from tests.integration.config_checks import check_config, config_id, configs_of


@pytest.mark.parametrize('path', configs_of('plain'), ids=config_id)
def test_config_builds_and_runs_loss_and_predict(path):
    check_config(path)
