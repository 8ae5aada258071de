"""Bad checkpoints given to the tools: each stops with one line naming the file or key and the
fix, and writes nothing."""

import argparse
import importlib.util
import os
import os.path as osp
import re

import pytest
import torch

from mmrepa.apis import init_model
from tests.helpers import DEMO, ROOT, run_script_here


def tool(name):
    spec = importlib.util.spec_from_file_location(name, osp.join(ROOT, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp('bad')
    good = str(root / 'good.pth')
    torch.save(dict(state_dict=init_model(DEMO).state_dict()), good)
    data = open(good, 'rb').read()
    other_arch = init_model(
        DEMO,
        cfg_options={'model.backbone.arch.embed_dims': 16, 'model.neck.in_channels': [32, 64, 128]},
    )
    hostile = argparse.ArgumentParser  # a foreign class outside the allow-list
    made = dict(
        missing=str(root / 'missing.pth'),
        truncated=(data[: len(data) // 3],),
        text=(b'a text file, not weights\n',),
        other_arch=dict(state_dict=other_arch.state_dict()),
        foreign_class=dict(state_dict=init_model(DEMO).state_dict(), parser=hostile),
    )
    paths = {}
    for name, content in made.items():
        path = str(root / f'{name}.pth')
        if isinstance(content, tuple):
            open(path, 'wb').write(content[0])
        elif isinstance(content, dict):
            torch.save(content, path)
        paths[name] = path
    folded = str(root / 'folded.pth')
    tool('reparameterize').main([DEMO, good, folded])
    paths['folded_into_unfolded'] = folded
    return root, paths


EXPECTED = {
    'missing': r'missing\.pth does not exist',
    'truncated': r'truncated\.pth is not a readable PyTorch checkpoint',
    'text': r'text\.pth is not a readable PyTorch checkpoint',
    'other_arch': r'does not fit this model: .*has shape .* in the checkpoint but .* in the '
    r'model\. Is it a checkpoint of another arch',
    'foreign_class': r'foreign_class\.pth contains argparse\.ArgumentParser, which mmrepa does '
    r'not load',
    'folded_into_unfolded': r'the checkpoint holds folded weights .*Build it with deploy=True',
}


@pytest.mark.parametrize('case', EXPECTED)
def test_reparameterize_tool_stops_with_one_line_and_writes_nothing(files, case):
    root, paths = files
    out = str(root / f'{case}_out.pth')
    with pytest.raises(SystemExit) as err:
        tool('reparameterize').main([DEMO, paths[case], out])
    message = str(err.value.code)
    assert message.startswith('tools/reparameterize.py: ') and '\n' not in message, message
    assert re.search(EXPECTED[case], message), message
    assert not osp.exists(out)


def test_test_tool_refuses_an_unreadable_checkpoint_before_writing_anything(files, tmp_path):
    _, paths = files
    os.makedirs(tmp_path / 'annotations')
    os.makedirs(tmp_path / 'val')
    (tmp_path / 'annotations' / 'val.json').write_text('{}')  # the data exist, the weights not
    work = str(tmp_path / 'work')
    # in this process (a traceback would raise here): the stop is one line, as in a terminal
    _, log = run_script_here(
        'tools/test.py',
        DEMO,
        paths['truncated'],
        '--work-dir',
        work,
        '--cfg-options',
        f'test_dataloader.dataset.data_root={tmp_path}/',
        f'test_evaluator.ann_file={tmp_path}/annotations/val.json',
        ok=False,
    )
    assert 'truncated.pth is not a readable PyTorch checkpoint' in log.splitlines()[-1], log[-2000:]
    assert not osp.exists(work)
