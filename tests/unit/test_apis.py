import copy
import os
import os.path as osp
from collections import OrderedDict

import pytest
from mmengine.config import Config
from mmengine.config import config as mmengine_config

from mmrepa.apis import TextOnceConfig, load_config
from mmrepa.config.checks import check_custom_imports
from mmrepa.integrations.cli.args import tool_argument_parser, tool_config
from tests.helpers import ROOT, fresh_mmengine_instances


def test_a_config_using_mmrepa_without_importing_it_is_refused(tmp_path):
    path = tmp_path / 'no_import.py'
    path.write_text(
        "_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'\n"
        "model = dict(backbone=dict(_delete_=True, type='RePaSwin'))\n"
        "custom_hooks = [dict(type='ReparameterizeHook')]\n"
    )
    with pytest.raises(
        ValueError,
        match=r'uses RePaSwin, ReparameterizeHook from mmrepa.*'
        r"custom_imports = dict\(imports=\['mmrepa'\]",
    ):
        load_config(str(path))


def test_configs_that_import_mmrepa_or_do_not_use_it_pass():
    check_custom_imports(
        Config.fromfile(osp.join(ROOT, 'configs', 'repa_swin', 'retinanet_repa_swin_b_1x_coco.py'))
    )
    check_custom_imports(Config(dict(model=dict(type='RetinaNet'))))


def test_tool_arguments_and_config(tmp_path, monkeypatch):
    config = osp.join(ROOT, 'configs', 'repa_swin', 'retinanet_repa_swin_t_1x_coco.py')
    parser = tool_argument_parser('a tool')
    parser.add_argument('checkpoint')
    args = parser.parse_args(
        [
            config,
            'ckpt.pth',
            '--cfg-options',
            'model.backbone.idle_ratio=0.5',
            '--launcher',
            'pytorch',
            '--local-rank',
            '3',
        ]
    )
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    cfg = tool_config(args)
    assert args.checkpoint == 'ckpt.pth'
    assert cfg.model.backbone.idle_ratio == 0.5
    assert cfg.launcher == 'pytorch' and os.environ['LOCAL_RANK'] == '3'
    assert cfg.work_dir == osp.join('./work_dirs', 'retinanet_repa_swin_t_1x_coco')
    # --work-dir first, then the config's own work_dir
    assert tool_config(parser.parse_args([config, 'c', '--work-dir', 'w'])).work_dir == 'w'
    own = tmp_path / 'own.py'
    own.write_text(f"_base_ = '{config}'\nwork_dir = 'mine'\n")
    assert tool_config(parser.parse_args([str(own), 'c'])).work_dir == 'mine'


def test_tools_without_a_launcher_still_check_custom_imports(tmp_path):
    parser = tool_argument_parser('a tool', distributed=False)
    with pytest.raises(SystemExit):
        parser.parse_args(['x.py', '--launcher', 'pytorch'])
    path = tmp_path / 'no_import.py'
    path.write_text("model = dict(backbone=dict(type='RePaSwin'))\n")
    args = parser.parse_args([str(path)])
    assert not hasattr(args, 'launcher')
    with pytest.raises(ValueError, match='does not import mmrepa'):
        tool_config(args)


def test_a_config_error_stops_a_tool_with_one_line():
    from mmrepa.errors import ConfigError
    from mmrepa.integrations.cli.args import one_line_errors

    @one_line_errors('tools/x.py')
    def main():
        raise ConfigError('config c.py: model.backbone.out_indices=(0, 1): set (3, )')

    with pytest.raises(SystemExit, match=r'^tools/x.py: config c.py: model.backbone'):
        main()


def test_what_a_failing_build_logs_is_not_printed_and_a_good_builds_is_after_it():
    """mmpretrain's data preprocessor logs an INFO line when the config has batch augmentations:
    a build that then fails (a head's bad option) shows its error alone."""
    import io
    import logging

    from mmengine.logging import MMLogger

    from mmrepa.apis import build_model

    augments = dict(augments=[dict(type='Mixup', alpha=0.8)])
    stream = io.StringIO()
    with fresh_mmengine_instances():
        logger = MMLogger.get_instance('test_apis_held_logs', log_level='INFO')
        handler = logging.StreamHandler(stream)
        handler.setLevel(logging.INFO)
        logger.addHandler(handler)
        cfg = load_config(
            osp.join(ROOT, 'configs', 'demo', 'classifier_repa_caformer_shapes.py'),
            {'model.data_preprocessor.batch_augments': augments, 'model.head.num_classes': 0},
        )
        with pytest.raises(ValueError, match='num_classes'):
            build_model(cfg)
        assert stream.getvalue() == ''
        cfg.model.head.num_classes = 3
        build_model(cfg)
    assert 'Because batch augmentations are enabled' in stream.getvalue()


def test_a_loaded_config_formats_its_text_once_per_content(monkeypatch):
    """A Runner deep-copies the config and asks for its text up to five times: yapf runs once,
    again only when the contents change, and the text is mmengine's (a plain Config of the
    same file is the reference)."""
    path = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')
    calls = []
    format_code = mmengine_config.FormatCode
    monkeypatch.setattr(
        mmengine_config, 'FormatCode', lambda *a, **k: calls.append(1) or format_code(*a, **k)
    )
    monkeypatch.setattr(TextOnceConfig, '_texts', OrderedDict())  # none kept from earlier tests
    cfg = copy.deepcopy(load_config(path))
    texts = [cfg.pretty_text for _ in range(3)]
    assert len(calls) == 1
    assert texts == [Config.fromfile(path).pretty_text] * 3 and len(calls) == 2
    cfg.model.backbone.depths = (1, 1, 1, 1)
    reference = Config.fromfile(path)
    reference.model.backbone.depths = (1, 1, 1, 1)
    assert cfg.pretty_text == reference.pretty_text != texts[0] and len(calls) == 4
