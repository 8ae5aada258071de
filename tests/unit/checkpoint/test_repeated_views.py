"""A 1.6 KB file holding a stride-0 view (``torch.zeros(1).expand(n, n)``) is n² values to any
full read: a checkpoint or token-label map of one is refused in one line from its storage's
size, before any check reads the values (issue 39, findings 2 and 8)."""

import subprocess
import sys

import pytest
import torch

from mmrepa.checkpoint import load_checkpoint_file
from mmrepa.datasets.token_label import read_label_map
from mmrepa.errors import CheckpointError, InputError
from tests.helpers import ROOT

# peak memory of the process, in KiB on Linux, before and after reading the file
MEASURE = """
import resource, sys
import mmrepa
from mmrepa.checkpoint import load_checkpoint_file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    load_checkpoint_file(sys.argv[1])
except Exception as err:
    print(type(err).__name__, err)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_checkpoint_of_a_repeating_view_is_refused_from_its_storage(tmp_path):
    path = tmp_path / 'expanded.pth'
    torch.save(dict(state_dict={'w': torch.zeros(1).expand(2**21, 2**21)}), path)
    assert path.stat().st_size < 4096
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_file(str(path))
    assert str(err.value) == (
        f"{path}: state_dict key 'w' is a view showing 1 stored value(s) as 4398046511104 "
        '(shape (2097152, 2097152), stride (0, 0)); weights are saved whole'
    )
    # a slice of a larger storage (shared or tied weights) is whole values: it loads
    whole = torch.arange(12.0)
    torch.save(dict(state_dict={'a': whole[:6].view(2, 3), 'b': whole[6:]}), path)
    assert torch.equal(load_checkpoint_file(str(path))['state_dict']['b'], whole[6:])


def test_refusing_12000_squared_costs_no_memory(tmp_path):
    path = tmp_path / 'expanded.pth'
    torch.save(dict(state_dict={'w': torch.zeros(1).expand(12000, 12000)}), path)
    proc = subprocess.run(
        [sys.executable, '-c', MEASURE, str(path)], capture_output=True, text=True, cwd=ROOT
    )
    message, peak_kib = proc.stdout.strip().splitlines()
    assert message.startswith('CheckpointError') and 'stride (0, 0)' in message, proc.stderr
    assert int(peak_kib) < 256 * 1024  # the values would be 549 MiB as float32


def test_a_token_label_map_of_a_repeating_view_is_refused(tmp_path):
    path = tmp_path / 'map.pt'
    torch.save(torch.zeros(1).expand(2, 3, 20000, 20000), path)
    with pytest.raises(InputError, match=r'map.pt holds a view showing its stored values more'):
        read_label_map(str(path), num_classes=5)
