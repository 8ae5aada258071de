"""What the tools do to and expect of their surroundings: outputs with the user's file mode and
one line naming the package when an optional dependency is missing. (That they start without
warnings is checked on the runs of test_tool_inputs.py, which read mmdet and mmseg configs.)"""

import os
import stat
import subprocess
import sys
import tempfile

import pytest

from mmrepa.checkpoint import save_atomically
from mmrepa.integrations.optional import INSTALL
from mmrepa.utils.files import atomic_output, set_user_mode
from tests.helpers import DEMO, ROOT, run_script_here, script_module


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize('umask', [0o022, 0o027])
def test_outputs_get_the_users_file_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        with open(tmp_path / 'plain.txt', 'w'):  # what open() and mmengine give
            pass
        expected = 0o666 & ~umask
        assert mode(tmp_path / 'plain.txt') == expected
        save_atomically({'state_dict': {}}, str(tmp_path / 'folded.pth'))  # reparameterize.py
        script_module('tools/quantize.py').write_json({'sqnr_db': 1.0}, str(tmp_path / 'q.json'))
        assert mode(tmp_path / 'folded.pth') == mode(tmp_path / 'q.json') == expected
        folder = tempfile.mkdtemp(dir=tmp_path)  # tools/deploy.py publishes one
        set_user_mode(folder)
        assert mode(folder) == 0o777 & ~umask
    finally:
        os.umask(old)


def test_an_interrupted_output_leaves_the_old_file(tmp_path):
    path = tmp_path / 'out.json'
    path.write_text('old')
    with pytest.raises(RuntimeError, match='interrupted'):
        with atomic_output(str(path)) as tmp:
            with open(tmp, 'w') as f:
                f.write('half')
            raise RuntimeError('interrupted')
    assert path.read_text() == 'old' and os.listdir(tmp_path) == ['out.json']


def test_help_needs_no_optional_dependency():
    code = (
        "import runpy, sys; sys.modules['onnx'] = sys.modules['onnxruntime'] = None; "
        "sys.argv = ['tools/quantize.py', '--help']; "
        "runpy.run_path('tools/quantize.py', run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith('usage: quantize.py'), proc.stderr


@pytest.mark.parametrize(
    'tool, args, module',
    [
        ('quantize', [DEMO, DEMO], 'onnxruntime'),
        ('export_onnx', [DEMO, '--shape', '64', '64'], 'onnx'),
        ('benchmark', [DEMO, '--onnx'], 'onnxruntime'),
        (
            'deploy',
            [DEMO, DEMO, 'configs/deploy/detection_onnxruntime_static.py', '--out', 'no/such/dir'],
            'mmdeploy',
        ),
    ],
)
def test_a_missing_optional_dependency_is_one_line(tool, args, module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    _, log = run_script_here(f'tools/{tool}.py', *args, ok=False)
    assert log.splitlines()[-1] == f'tools/{tool}.py: needs {module} ({INSTALL[module]})'
    assert 'Traceback' not in log
