"""Every checkpoint scheme mmengine's ``CheckpointLoader`` knows, fetched as mmengine fetches it
and read by :func:`.restricted_load.load_restricted`.

mmengine's own loaders deserialize with ``torch.load`` (for URLs through
``torch.hub.load_state_dict_from_url``, whose default is ``weights_only=False``, and which also
unpacks a zip it finds in its cache into the cache directory). The loaders below only fetch:
a URL into torch.hub's cache under the same file name (so a file mmengine or torch.hub cached
is used, and one cached here serves them), ``torchvision://``, ``open-mmlab://`` and
``mmcls://`` through mmengine's tables of names, ``s3://``/``petrel://`` into memory, ``pavi://``
into a temporary directory; then they hand the file to the one restricted loader.

:func:`install_restricted_loader` (run by ``import mmrepa``) registers them with
``CheckpointLoader`` for every prefix, so ``init_cfg=Pretrained``, ``load_from``, resume,
``mmengine.runner.load_checkpoint`` and the tools all read through them.
"""

import io
import os
import os.path as osp
import re
import sys
import tempfile
from typing import Any, Callable, Dict, Optional
from urllib.parse import urlparse

import torch
from mmengine.dist import get_dist_info
from mmengine.fileio import get_file_backend
from mmengine.runner import checkpoint as mm_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from ..errors import CheckpointError, DependencyError
from .restricted_load import load_restricted


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """A local path (mmengine's fallback for any name without a known prefix)."""
    filename = osp.expanduser(str(filename))
    if not osp.isfile(filename):
        raise FileNotFoundError(
            f'checkpoint {filename} does not exist: check the path (see '
            "the README's 'Data and checkpoints')"
        )
    return load_restricted(filename, filename, map_location)


def cached_download(url: str, model_dir: Optional[str] = None) -> str:
    """The file torch.hub's ``load_state_dict_from_url`` keeps ``url`` in
    (``<hub dir>/checkpoints/<file name of the URL>``), downloaded first if it is not there."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    cached = osp.join(model_dir, osp.basename(urlparse(url).path))
    if not osp.exists(cached):
        os.makedirs(model_dir, exist_ok=True)
        sys.stderr.write(f'Downloading: "{url}" to {cached}\n')
        torch.hub.download_url_to_file(url, cached, None, progress=os.isatty(0))
    return cached


def load_from_http(filename: str, map_location: Any = None, model_dir: Optional[str] = None) -> Any:
    """``http(s)://``: as mmengine, local rank 0 downloads first, the others then find it."""
    rank, world_size = get_dist_info()
    if rank == 0:
        cached = cached_download(filename, model_dir)
    if world_size > 1:
        torch.distributed.barrier()
        if rank > 0:
            cached = cached_download(filename, model_dir)
    return load_restricted(cached, f'{filename} (cached as {cached})', map_location)


def _named(table: Dict[str, str], name: str, filename: str) -> str:
    if name not in table:
        raise CheckpointError(
            f"{filename}: no checkpoint is named {name!r} in mmengine's "
            'table for this scheme; check the spelling'
        )
    return table[name]


def load_from_torchvision(filename: str, map_location: Any = None) -> Any:
    """``torchvision://NAME`` (and the older ``modelzoo://NAME``): torchvision's URL of NAME."""
    name = filename.split('://', 1)[1]
    return load_from_http(
        _named(mm_checkpoint.get_torchvision_models(), name, filename), map_location
    )


def load_from_openmmlab(filename: str, map_location: Any = None) -> Any:
    """``open-mmlab://NAME`` / ``openmmlab://NAME``: mmengine's URL (or file under mmengine's
    home) of NAME, after its renames of deprecated names."""
    name = filename.split('://', 1)[1]
    name = mm_checkpoint.get_deprecated_model_names().get(name, name)
    url = _named(mm_checkpoint.get_external_models(), name, filename)
    if url.startswith(('http://', 'https://')):
        return load_from_http(url, map_location)
    return load_from_local(osp.join(mm_checkpoint._get_mmengine_home(), url), map_location)


def load_from_mmcls(filename: str, map_location: Any = None) -> Any:
    """``mmcls://NAME``: the mmcls checkpoint's backbone weights, as mmengine gives them."""
    name = filename[len('mmcls://') :]
    checkpoint = load_from_http(
        _named(mm_checkpoint.get_mmcls_models(), name, filename), map_location
    )
    return mm_checkpoint._process_mmcls_checkpoint(checkpoint)


def load_from_pavi(filename: str, map_location: Any = None) -> Any:
    """``pavi://PATH``: downloaded by pavi's model cloud into a temporary directory."""
    try:
        from pavi import modelcloud
    except ImportError:
        raise DependencyError(
            f'{filename}: pavi:// checkpoints need pavi (pip install pavi)'
        ) from None
    model = modelcloud.get(filename[len('pavi://') :])
    with tempfile.TemporaryDirectory() as tmp_dir:
        downloaded = osp.join(tmp_dir, osp.basename(model.name))
        model.download(downloaded)
        return load_restricted(downloaded, filename, map_location)


def load_from_ceph(filename: str, map_location: Any = None, backend: str = 'petrel') -> Any:
    """``s3://`` / ``petrel://`` (optionally ``NAME:s3://``): read into memory by mmengine's
    file backend."""
    file_backend = get_file_backend(filename, backend_args={'backend': backend})
    with io.BytesIO(file_backend.get(filename)) as buffer:
        return load_restricted(buffer, filename, map_location)


# mmengine 0.10's prefixes (regular expressions, matched at the start) and our loader for each.
SCHEMES: Dict[str, Callable] = {
    '': load_from_local,
    'http://': load_from_http,
    'https://': load_from_http,
    'modelzoo://': load_from_torchvision,
    'torchvision://': load_from_torchvision,
    'open-mmlab://': load_from_openmmlab,
    'openmmlab://': load_from_openmmlab,
    'mmcls://': load_from_mmcls,
    'pavi://': load_from_pavi,
    r'(\S+\:)?s3://': load_from_ceph,
    r'(\S+\:)?petrel://': load_from_ceph,
}


def loader_for(filename: str) -> Callable:
    """Our loader for ``filename``, chosen as ``CheckpointLoader`` chooses (prefixes in reverse
    order, so longer ones first, the local loader last)."""
    for prefix in sorted(SCHEMES, reverse=True):
        if re.match(prefix, filename) is not None:
            return SCHEMES[prefix]
    return load_from_local


def load_checkpoint_file(filename: str, map_location: Any = 'cpu') -> Any:
    """Read a checkpoint of any project's layout, from a path or any scheme of
    :data:`SCHEMES`, without running its code; checked as :mod:`.validation` describes.

    Raises:
        FileNotFoundError: no such local file.
        CheckpointError: unreadable, refused or malformed; the one-line message names the file
            and says what to do.
    """
    filename = str(filename)
    return loader_for(filename)(filename, map_location)


def install_restricted_loader() -> None:
    """Make mmengine's ``CheckpointLoader`` use our loaders for every scheme it knows."""
    for prefix, loader in SCHEMES.items():
        CheckpointLoader.register_scheme(prefixes=prefix, loader=loader, force=True)
