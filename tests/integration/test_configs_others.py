"""Every config in configs/prepbn_swin/, prepbn_pvt/, repopt_vgg/, poolformer/ and demo/
builds, and its model runs one loss step and one predict step
on a small input (config_checks.check_config)."""

import os.path as osp

import pytest

from tests.integration.config_checks import check_config, config_id, configs_of


@pytest.mark.parametrize('path', configs_of('others'), ids=config_id)
def test_config_builds_and_runs_loss_and_predict(path):
    check_config(path)


def test_every_config_is_covered():
    from tests.integration.config_checks import CONFIGS, FULL_SIZE, GROUPS

    names = {osp.basename(c) for c in CONFIGS}
    for size in 'tsb':
        assert f'retinanet_repa_swin_{size}_1x_coco.py' in names
        assert f'retinanet_swin_{size}_1x_coco.py' in names
        assert f'upernet_repa_swin_{size}_512x512_160k_ade20k.py' in names
    assert len(CONFIGS) >= 25
    assert FULL_SIZE <= names  # a renamed one would silently run shrunk
    # each config is in exactly one test_configs_<group>.py: a new folder joins a group
    grouped = [c for group in GROUPS for c in configs_of(group)]
    assert sorted(grouped) == sorted(CONFIGS)
