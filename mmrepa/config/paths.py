"""Where a config named on the command line is.

The configs moved into one folder per algorithm (``configs/repa_swin/...``), keeping their file
names; commands written before, such as ``tools/train.py
configs/retinanet_repa_swin_b_1x_coco.py``, must keep working. So a config path that does not
exist is looked for one folder down, under the same name: one match is that config (the file
itself, never a copy that could drift); otherwise the error names the closest configs.
"""

import difflib
import glob
import os
import os.path as osp
from typing import List


def find_config(path: str) -> str:
    """``path`` if it is a file, else the one config of that name in a subfolder of its folder;
    raises ``FileNotFoundError`` with the closest existing configs."""
    if osp.isfile(path):
        return path
    folder, name = osp.split(path)
    moved = sorted(glob.glob(osp.join(glob.escape(folder or os.curdir), '*', glob.escape(name))))
    moved = [m for m in moved if osp.isfile(m)]
    if len(moved) == 1:
        return osp.normpath(moved[0])
    close = moved or closest_configs(path)
    hint = f': did you mean {" or ".join(close)}?' if close else ''
    raise FileNotFoundError(f'{path}: no such config file{hint}')


def closest_configs(path: str, n: int = 3) -> List[str]:
    """The configs whose names are closest to ``path``'s, under the nearest existing folder
    above it (``configs/`` for ``configs/x/y.py``)."""
    folder = osp.dirname(path)
    while folder and not osp.isdir(folder):
        folder = osp.dirname(folder)
    if not folder and osp.dirname(path):  # no folder it names is here: another directory
        return []
    top = folder or os.curdir
    found = {}
    for visited, (dirpath, dirnames, filenames) in enumerate(os.walk(top)):
        if visited == 1000:  # a configs folder has tens; not a whole disk
            break
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(('.', '_')))
        for f in sorted(filenames):
            if f.endswith('.py'):
                found.setdefault(f, osp.normpath(osp.join(dirpath, f)))
    name = osp.basename(path)
    started = sorted(f for f in found if f.startswith(osp.splitext(name)[0]))  # a name cut short
    if started:
        return [found[f] for f in started[:n]]
    # a typo of the B model's name: not also the T and S ones
    return [found[m] for m in closest(name, found, n, margin=0.01)]


def closest(word: str, words, n: int = 3, margin: float = 0.03) -> List[str]:
    """The ``words`` closest to ``word`` (difflib's ratio, at least 0.6), and of the next ones
    only those within ``margin`` of the best: a typo names its word, not also its siblings."""
    close = difflib.get_close_matches(word, list(words), n=n, cutoff=0.6)
    best = difflib.SequenceMatcher(None, word, close[0]).ratio() if close else 0
    return [c for c in close if difflib.SequenceMatcher(None, word, c).ratio() > best - margin]
