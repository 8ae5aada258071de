"""Outputs never destroy inputs (issue 23, point 2): every tool that writes refuses, with one
line naming the option, an output that is an input, links to one (symbolic or hard link) or,
for a folder, holds one; ``--force`` replaces outputs, never inputs; a killed save leaves the
old output (and, on SIGTERM, no temporary file).

The tools run in this process (``run_script_here``) and stop at the guard, before a model or a
runner is built: every input but the demo config's data is a few bytes.
"""

import hashlib
import os
import os.path as osp
import re
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from mmrepa.datasets import make_shapes_coco
from mmrepa.errors import InputError
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.utils.files import atomic_folder, atomic_output
from tests.helpers import DEMO, ROOT, run_script_here, shapes_cfg_options

DEPLOY_CFG = osp.join(ROOT, 'configs', 'deploy', 'detection_onnxruntime_static.py')
FILES_PY = osp.join(ROOT, 'mmrepa', 'utils', 'files.py')


class Inputs:
    """The inputs of every run: a copy of the demo config (its base is mmdet's, so it loads
    from anywhere), a training work dir holding a checkpoint and its log, an image in an image
    folder, and a small shapes data set the config is pointed at."""

    def __init__(self, root):
        self.root = root
        self.config = str(root / 'retinanet.py')
        with open(DEMO) as src, open(self.config, 'w') as dst:
            dst.write(src.read())
        work = root / 'work_dir'
        work.mkdir()
        self.work_dir, self.ckpt = str(work), str(work / 'epoch_1.pth')
        (work / 'epoch_1.pth').write_bytes(os.urandom(1024))  # never read: the guard is first
        (work / '20240101_000000.log').write_text('the training log\n')
        self.images = root / 'images'
        self.images.mkdir()
        self.image = str(self.images / 'street.png')
        Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(self.image)
        self.images = str(self.images)
        self.data = make_shapes_coco(str(root / 'data'), num_train=2, num_val=2, size=32)
        self.options = ['--cfg-options', *shapes_cfg_options(self.data + '/')]

    def digest(self) -> dict:
        """sha256 of every input file, and of the repository files the runs name."""
        paths = [DEMO, DEPLOY_CFG] + [osp.join(r, f) for r, _, fs in os.walk(self.root) for f in fs]
        return {p: hashlib.sha256(open(p, 'rb').read()).hexdigest() for p in sorted(paths)}


@pytest.fixture(scope='module')
def inputs(tmp_path_factory):
    return Inputs(tmp_path_factory.mktemp('inputs'))


def refused(inputs, script, *args, option, names):
    """Run ``script``; assert it stops with one line that starts with the tool and the option
    and names ``names`` (the input), and that no input changed."""
    before = inputs.digest()
    _, log = run_script_here(script, *args, ok=False)
    lines = log.strip().splitlines()
    assert len(lines) == 1, log[-3000:]
    assert lines[0].startswith(f'{script}: {option} ') and names in lines[0], lines[0]
    assert 'input' in lines[0], lines[0]
    assert inputs.digest() == before
    return lines[0]


def linked(kind: str, target: str, tmp_path, suffix: str = '') -> str:
    """``target`` itself, or a new symbolic or hard link to it."""
    if kind == 'same':
        return target
    link = str(tmp_path / f'{kind}{suffix}')
    (os.symlink if kind == 'symlink' else os.link)(target, link)
    return link


# (script, option, the input the output hits, argv with {out}); with --force where the tool has it
FILE_OUTPUTS = [
    ('tools/reparameterize.py', 'OUT', 'ckpt', ['{config}', '{ckpt}', '{out}', '--force']),
    ('tools/reparameterize.py', 'OUT', 'config', ['{config}', '{ckpt}', '{out}', '--force']),
    (
        'tools/misc/repopt_export_scales.py',
        'OUT',
        'ckpt',
        ['{config}', '{ckpt}', '{out}', '--force'],
    ),
    (
        'tools/export_onnx.py',
        '--out',
        'ckpt',
        ['{config}', '{ckpt}', '--shape', '32', '32', '--out', '{out}'],
    ),
    ('tools/test.py', '--dump-metrics', 'ckpt', ['{config}', '{ckpt}', '--dump-metrics', '{out}']),
    ('tools/test.py', '--out', 'ckpt', ['{config}', '{ckpt}', '--out', '{out}']),
    (
        'tools/benchmark.py',
        '--out',
        'ckpt',
        ['{config}', '--checkpoint', '{ckpt}', '--out', '{out}'],
    ),
    (
        'tools/benchmark.py',
        '--plot',
        'config',
        ['{config}', '--checkpoint', '{ckpt}', '--plot', '{out}'],
    ),
    (
        'tools/vis_features.py',
        '--out-file',
        'image',
        ['{config}', '{ckpt}', '{image}', '--out-file', '{out}'],
    ),
    (
        'tools/image_demo.py',
        '--out-file',
        'image',
        ['{config}', '{ckpt}', '{image}', '--out-file', '{out}'],
    ),
    ('tools/recalibrate_bn.py', 'OUT', 'ckpt', ['{config}', '{ckpt}', '{out}']),
    ('tools/quantize.py', '--out', 'ckpt', ['{config}', '{ckpt}', '--out', '{out}', '--force']),
    ('tools/quantize.py', '--dump', 'config', ['{config}', '{ckpt}', '--dump', '{out}']),
    (
        'tools/get_flops.py',
        '--json',
        'ckpt',
        ['{config}', '--checkpoint', '{ckpt}', '--json', '{out}'],
    ),
]


def fill(argv, inputs, out):
    values = dict(
        config=inputs.config,
        ckpt=inputs.ckpt,
        image=inputs.image,
        images=inputs.images,
        work_dir=inputs.work_dir,
        out=out,
    )
    return [a.format(**values) for a in argv]


@pytest.mark.parametrize('kind', ['same', 'symlink', 'hardlink'])
@pytest.mark.parametrize(
    'script, option, hit, argv',
    FILE_OUTPUTS,
    ids=[f'{c[0].split("/")[-1][:-3]}{c[1]}={c[2]}' for c in FILE_OUTPUTS],
)
def test_a_file_output_on_an_input_is_refused(inputs, tmp_path, script, option, hit, argv, kind):
    target = getattr(inputs, hit)
    # test.py's --out must be a .pkl: the link is named so, the guard still comes first
    out = linked(kind, target, tmp_path, '.pkl' if option == '--out' else '')
    line = refused(inputs, script, *fill(argv, inputs, out), option=option, names=target)
    how = {
        'same': ' is the input ',
        'symlink': ' is a symbolic link to the input ',
        'hardlink': ' is a hard link to the input ',
    }[kind]
    assert how in line, line


# folders the tools write: test.py --show-dir, image_demo.py --out-dir, deploy.py --out
FOLDER_OUTPUTS = [
    ('tools/test.py', '--show-dir', ['{config}', '{ckpt}', '--show-dir', '{out}']),
    ('tools/image_demo.py', '--out-dir', ['{config}', '{ckpt}', '{images}', '--out-dir', '{out}']),
    ('tools/deploy.py', '--out', ['{config}', '{ckpt}', DEPLOY_CFG, '--out', '{out}', '--force']),
]


@pytest.mark.parametrize('kind', ['holds', 'symlink', 'hardlink'])
@pytest.mark.parametrize(
    'script, option, argv', FOLDER_OUTPUTS, ids=[c[0].split('/')[-1][:-3] for c in FOLDER_OUTPUTS]
)
def test_a_folder_holding_an_input_is_refused(inputs, tmp_path, script, option, argv, kind):
    """The review's case: deploy.py --out <the training work dir> --force deleted the
    checkpoint and the log. Also through a symbolic link to that folder, and a folder holding
    a hard link to the checkpoint."""
    if kind == 'hardlink':
        out = str(tmp_path / 'pictures')
        os.mkdir(out)
        os.link(inputs.ckpt, osp.join(out, 'kept.pth'))
    else:
        out = linked('same' if kind == 'holds' else 'symlink', inputs.work_dir, tmp_path)
    line = refused(inputs, script, *fill(argv, inputs, out), option=option, names=inputs.ckpt)
    assert 'holds' in line and 'choose another folder' in line, line


def test_an_output_folder_that_is_an_input_folder_is_refused(inputs, tmp_path):
    # image_demo.py FOLDER --out-dir FOLDER would draw over every image
    refused(
        inputs,
        'tools/image_demo.py',
        inputs.config,
        inputs.ckpt,
        inputs.images,
        '--out-dir',
        inputs.images,
        option='--out-dir',
        names=inputs.images,
    )
    # the test data (from the config, once loaded): --show-dir the image folder, the data root
    # holding it, --dump-metrics the annotation file
    for option, out, names in [
        ('--show-dir', osp.join(inputs.data, 'val'), osp.join(inputs.data, 'val')),
        ('--show-dir', inputs.data, inputs.data),
        (
            '--dump-metrics',
            osp.join(inputs.data, 'annotations', 'val.json'),
            osp.join(inputs.data, 'annotations', 'val.json'),
        ),
    ]:
        line = refused(
            inputs,
            'tools/test.py',
            inputs.config,
            inputs.ckpt,
            option,
            out,
            *inputs.options,
            option=option,
            names=names,
        )
        assert 'test ' in line, line  # which input: 'test image directory', 'test data root'
    # recalibrate_bn.py reads the training split
    train = osp.join(inputs.data, 'annotations', 'train.json')
    refused(
        inputs,
        'tools/recalibrate_bn.py',
        inputs.config,
        inputs.ckpt,
        train,
        *inputs.options,
        option='OUT',
        names=train,
    )


def test_an_existing_output_folder_needs_force(inputs, tmp_path):
    out = tmp_path / 'old_export'
    out.mkdir()
    (out / 'report.json').write_text('{}')
    _, log = run_script_here(
        'tools/deploy.py', inputs.config, inputs.ckpt, DEPLOY_CFG, '--out', out, ok=False
    )
    assert log.strip().splitlines() == [
        f'tools/deploy.py: --out {out} exists; pass --force to replace it'
    ]
    assert os.listdir(out) == ['report.json'] and sorted(os.listdir(tmp_path)) == ['old_export']


def test_force_replaces_a_written_checkpoint(inputs, tmp_path):
    """The whole path once: tools/reparameterize.py on a real (random) checkpoint, an existing
    OUT refused without --force and replaced with it, in the user's mode, no temporary left."""
    import torch

    from mmrepa.apis import init_model

    ckpt = str(tmp_path / 'model.pth')
    torch.save(dict(state_dict=init_model(DEMO).state_dict()), ckpt)
    out = tmp_path / 'out' / 'folded.pth'
    out.parent.mkdir()
    out.write_bytes(b'an older fold')
    log = run_script_here('tools/reparameterize.py', DEMO, ckpt, out, ok=False)[1]
    assert log.strip().splitlines() == [
        f'tools/reparameterize.py: OUT {out} exists; pass --force to replace it'
    ]
    run_script_here('tools/reparameterize.py', DEMO, ckpt, out, '--force')
    assert torch.load(out, map_location='cpu')['meta']['mmrepa']['deploy'] is True
    assert os.listdir(out.parent) == ['folded.pth']
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o666 & ~umask
    before = open(ckpt, 'rb').read()
    refused(
        inputs, 'tools/reparameterize.py', DEMO, ckpt, ckpt, '--force', option='OUT', names=ckpt
    )  # --force onto the input: still refused
    assert open(ckpt, 'rb').read() == before


def test_the_guard_names_what_cannot_be_written(tmp_path):
    a, b = str(tmp_path / 'a.json'), str(tmp_path / 'file')
    open(b, 'w').close()
    for outputs, message in [
        ([('--out', a), ('--plot', a)], '--out and --plot are both'),
        ([('--out', str(tmp_path))], f'--out {tmp_path} is a folder; name a file'),
        ([('--out-dir', b, True)], f'--out-dir {b} is a file; name a folder'),
        ([('--out', osp.join(b, 'x.json'))], f'--out {b}/x.json: {b} is a file, not a'),
    ]:
        with pytest.raises(InputError, match='^tool: ' + re.escape(message)):
            check_outputs('tool', outputs, [])
    check_outputs('tool', [('--out', a), ('--plot', None)], [('checkpoint', 'https://x/y.pth')])
    assert os.listdir(tmp_path) == ['file']  # the guard creates nothing


def test_a_failed_write_leaves_the_old_output_and_no_folder_it_made(tmp_path):
    old = tmp_path / 'pictures'
    old.mkdir()
    (old / 'a.png').write_text('old a')
    for write in (
        lambda: atomic_output(str(tmp_path / 'new' / 'deeper' / 'x.json')),
        lambda: atomic_folder(str(tmp_path / 'new' / 'deeper')),
        lambda: atomic_folder(str(old), replace=False),
    ):
        with pytest.raises(KeyboardInterrupt):
            with write() as tmp:
                with open(osp.join(tmp, 'a.png') if osp.isdir(tmp) else tmp, 'w') as f:
                    f.write('half')
                raise KeyboardInterrupt  # Ctrl-C
        assert sorted(os.listdir(tmp_path)) == ['pictures']
    assert os.listdir(old) == ['a.png'] and (old / 'a.png').read_text() == 'old a'
    # written through: merged into the folder (its other files kept), or replacing it
    with atomic_folder(str(old), replace=False) as tmp:
        os.makedirs(osp.join(tmp, 'sub'))
        for name in ('b.png', 'sub/c.png'):
            with open(osp.join(tmp, name), 'w') as f:
                f.write('new')
    assert sorted(os.listdir(old)) == ['a.png', 'b.png', 'sub']
    with atomic_folder(str(old)) as tmp:
        open(osp.join(tmp, 'only.txt'), 'w').close()
    assert os.listdir(old) == ['only.txt'] and sorted(os.listdir(tmp_path)) == ['pictures']


# A process saving a checkpoint (16 MB) through the guard, stalled after its first MB is on disk
# so that it is killed mid-write; or filling an output folder, stalled after its first file.
SAVER = textwrap.dedent("""
    import importlib.util, io, os, sys, time
    spec = importlib.util.spec_from_file_location('files', sys.argv[1])
    files = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(files)

    def stall():
        print('stalled', flush=True)
        time.sleep(120)

    if sys.argv[3] == 'folder':
        with files.atomic_folder(sys.argv[2]) as tmp:
            with open(os.path.join(tmp, 'end2end.onnx'), 'wb') as f:
                f.write(b'new' * 1000)
            stall()
        sys.exit(0)

    import torch

    class Stalling(io.FileIO):
        written = 0

        def write(self, data):
            n = super().write(data)
            Stalling.written += n
            if Stalling.written > 1 << 20:
                self.flush()
                stall()
            return n

    with files.atomic_output(sys.argv[2]) as tmp, Stalling(tmp, 'wb') as f:
        torch.save(dict(state_dict=dict(w=torch.ones(4 << 20))), f)
""")


def start_saver(out, what):
    proc = subprocess.Popen(
        [sys.executable, '-c', SAVER, FILES_PY, str(out), what],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    return proc


def test_a_killed_save_leaves_the_old_output(tmp_path):
    for sub in ('term', 'kill', 'folder'):
        (tmp_path / sub).mkdir()
    old = b'the previous checkpoint'
    (tmp_path / 'term' / 'model.pth').write_bytes(old)
    (tmp_path / 'kill' / 'model.pth').write_bytes(old)
    (tmp_path / 'folder' / 'deploy').mkdir()
    (tmp_path / 'folder' / 'deploy' / 'end2end.onnx').write_bytes(old)
    procs = {
        sub: start_saver(
            tmp_path / sub / ('deploy' if sub == 'folder' else 'model.pth'),
            'folder' if sub == 'folder' else 'file',
        )
        for sub in ('term', 'kill', 'folder')
    }  # at once: the imports overlap
    for sub, proc in procs.items():
        assert proc.stdout.readline() == 'stalled\n', proc.communicate()[1][-3000:]
        temporaries = [p for p in os.listdir(tmp_path / sub) if p.startswith('.')]
        assert len(temporaries) == 1  # mid-write: the temporary is there, partly written
        if sub != 'folder':
            assert os.path.getsize(tmp_path / sub / temporaries[0]) > 1 << 20
        proc.send_signal(signal.SIGKILL if sub == 'kill' else signal.SIGTERM)
    for sub, proc in procs.items():
        _, err = proc.communicate(timeout=60)
        if sub == 'kill':
            assert proc.returncode == -signal.SIGKILL
        else:  # ended by SIGTERM after the finally blocks ran
            assert proc.returncode == -signal.SIGTERM, err[-3000:]
            assert [p for p in os.listdir(tmp_path / sub) if p.startswith('.')] == []
    assert (tmp_path / 'term' / 'model.pth').read_bytes() == old
    assert (tmp_path / 'kill' / 'model.pth').read_bytes() == old  # a temporary may remain
    assert os.listdir(tmp_path / 'folder') == ['deploy']
    assert os.listdir(tmp_path / 'folder' / 'deploy') == ['end2end.onnx']
    assert (tmp_path / 'folder' / 'deploy' / 'end2end.onnx').read_bytes() == old
