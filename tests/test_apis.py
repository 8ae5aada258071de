import os.path as osp

import pytest
from mmengine.config import Config

from mmrepa.apis import check_custom_imports, load_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_a_config_using_mmrepa_without_importing_it_is_refused(tmp_path):
    path = tmp_path / 'no_import.py'
    path.write_text("_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'\n"
                    "model = dict(backbone=dict(_delete_=True, type='RePaSwin'))\n"
                    "custom_hooks = [dict(type='ReparameterizeHook')]\n")
    with pytest.raises(ValueError, match=r"uses RePaSwin, ReparameterizeHook from mmrepa.*"
                       r"custom_imports = dict\(imports=\['mmrepa'\]"):
        load_config(str(path))


def test_configs_that_import_mmrepa_or_do_not_use_it_pass():
    check_custom_imports(Config.fromfile(
        osp.join(ROOT, 'configs', 'retinanet_repa_swin_b_1x_coco.py')))
    check_custom_imports(Config(dict(model=dict(type='RetinaNet'))))
