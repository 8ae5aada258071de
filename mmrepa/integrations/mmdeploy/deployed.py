"""Run what ``tools/deploy.py`` exported: the backend files of its output folder through
mmdeploy's task processor and backend model (the path ``tools/deploy.py`` checks them on), from
an image file to the data sample mmdet's ``inference_detector`` or mmseg's ``inference_model``
returns.

mmdeploy 1.3.1 builds its task processors and backend models from its own registries
(``Codebases``, ``mmdet_tasks``, ``backend_detectors``, ...) after setting the default scope to
the codebase's (``register_all_modules(True)``: 'mmdet'). Their trees have no node of that
scope, so mmengine warns 'Failed to search registry with scope "mmdet"' at each build and falls
back to the registry itself. No default scope avoids it: 'mmdeploy' has no ``mmdeploy.registry``
(another warning) and mmdet's own builds need 'mmdet'. :func:`add_scope_nodes` gives those trees
a node of the scope, which the search finds and whose lookups go to the registry itself.
"""

import importlib
import json
import os.path as osp
import pkgutil
from typing import List, Sequence, Tuple

import torch
from mmengine.config import Config
from mmengine.registry import Registry

from ...checkpoint import read_restricted
from ...errors import InputError
from ..optional import require

# what tools/deploy.py writes besides the backend's files (report.json names those)
FILES = ('report.json', 'model_cfg.py', 'deploy_cfg.py', 'folded.pth')


def add_scope_nodes(scope: str) -> None:
    """Give the root registries of mmdeploy's ``scope`` codebase (and ``Codebases``) a child of
    ``scope``, so that their builds in that default scope find it (no warning); once."""
    package = importlib.import_module(f'mmdeploy.codebase.{scope}.deploy')
    names = ['mmdeploy.codebase.base.mmcodebase'] + [
        f'{package.__name__}.{m.name}' for m in pkgutil.iter_modules(package.__path__)
    ]
    for name in names:
        for value in list(vars(importlib.import_module(name)).values()):
            if (
                isinstance(value, Registry)
                and value.parent is None
                and value.scope == 'mmdeploy'
                and scope not in value.children
            ):
                Registry(value.name, parent=value, scope=scope)


def build_backend_model(model_cfg: Config, deploy_cfg: Config, files: Sequence[str], device='cpu'):
    """mmdeploy's task processor of the configs, and its backend model of ``files``."""
    from mmdeploy.apis.utils import build_task_processor
    from mmdeploy.utils import get_codebase

    add_scope_nodes(get_codebase(deploy_cfg, model_cfg).value)
    processor = build_task_processor(model_cfg, deploy_cfg, device)
    return processor, processor.build_backend_model(files, processor.update_data_preprocessor)


def _report(path: str) -> dict:
    """``tools/deploy.py``'s report.json, if it is one (with the backend, its files and the
    input size); else ``{}``."""
    try:
        with open(path) as f:
            report = json.load(f)
        return report if {'backend', 'backend_files', 'input_shape'} <= set(report) else {}
    except (ValueError, TypeError):  # not JSON, not an object
        return {}


def deployed_files(folder: str) -> Tuple[dict, List[str]]:
    """The report of a ``tools/deploy.py`` output folder and the paths of the files it holds
    (:data:`FILES`, then the backend's); :class:`~mmrepa.errors.InputError` if it is not one."""
    missing = [f for f in FILES if not osp.isfile(osp.join(folder, f))]
    report = {} if missing else _report(osp.join(folder, 'report.json'))
    if report:
        missing = [f for f in report['backend_files'] if not osp.isfile(osp.join(folder, f))]
    elif not missing:
        missing = ['backend, backend_files and input_shape in report.json']
    if missing:
        raise InputError(
            f'{folder} is not a tools/deploy.py output folder (no {", ".join(missing)})'
        )
    return report, [osp.join(folder, f) for f in (*FILES, *report['backend_files'])]


class DeployedModel:
    """The model of a ``tools/deploy.py`` output ``folder`` in its backend (ONNX Runtime,
    OpenVINO): ``model(image)`` is the data sample of an image file, post-processed as mmdet
    and mmseg do; ``dataset_meta`` is the PyTorch model's (classes, palette)."""

    def __init__(self, folder: str, device: str = 'cpu', tool: str = 'mmrepa'):
        report, paths = deployed_files(folder)
        self.folder = folder
        self.backend, self.input_shape = report['backend'], report['input_shape']
        require(self.backend, tool=tool)  # one line naming the install, before the build
        self.model_cfg = Config.fromfile(osp.join(folder, 'model_cfg.py'))
        self.deploy_cfg = Config.fromfile(osp.join(folder, 'deploy_cfg.py'))
        weights = osp.join(folder, 'folded.pth')
        self.dataset_meta = read_restricted(weights, weights)['meta']['dataset_meta']
        self.processor, self.model = build_backend_model(
            self.model_cfg, self.deploy_cfg, paths[len(FILES) :], device
        )

    def __call__(self, image: str):
        from mmdeploy.utils import get_input_shape

        inputs, _ = self.processor.create_input(image, get_input_shape(self.deploy_cfg))
        shape = list(inputs['inputs'][0].shape[-2:])
        if shape != self.input_shape:  # the backend would stop with a traceback
            raise InputError(
                f'{image}: the test pipeline makes it {shape[0]} x {shape[1]}, but the model in '
                f'{self.folder} is exported for {self.input_shape[0]} x {self.input_shape[1]} '
                '(static shapes: resize the image, or export for its size)'
            )
        with torch.no_grad():
            return self.model.test_step(inputs)[0]
