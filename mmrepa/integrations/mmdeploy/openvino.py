"""A current OpenVINO backend for mmdeploy 1.3.1, registered in place of its own.

mmdeploy 1.3.1's OpenVINO backend cannot run with OpenVINO 2023 or later: its wrapper imports
``openvino.inference_engine.IECore`` and its converter runs the ``mo`` command, both removed
(OpenVINO 2026 has no ``openvino.runtime`` either). The manager and wrapper below take their
place under the same name, ``openvino``, so that a deploy config with
``backend_config = dict(type='openvino')`` works with mmdeploy's own APIs (``torch2onnx``, the
task processors' ``build_backend_model``, ``inference_model``):

- ``to_backend``: ``openvino.convert_model`` reads the ONNX file and the IR is saved beside it
  with float32 weights (``end2end.xml`` / ``end2end.bin``);
- the wrapper: ``openvino.Core`` compiles the IR for the CPU in float32 (see
  :func:`mmrepa.integrations.openvino.compile_model`), with torch's thread count, and returns
  the outputs by name.

The ONNX graph is the one mmrepa exports for ONNX Runtime: mmrepa's rewrites
(:mod:`.rewriters`, :mod:`.mmdet_heads`) are registered for both backends, in standard ONNX ops
that OpenVINO's ONNX reader takes. mmdeploy's OpenVINO rewrite of mmdet's ``SingleRoIExtractor``
(one ``ExperimentalDetectronROIFeatureExtractor`` node) is removed: that op assigns RoIs to
levels by its own rule, not mmdet's ``finest_scale``, so RoIs near a level boundary would pool
other features than PyTorch's; mmcv's RoIAlign exported as ONNX ``RoiAlign`` (half_pixel) is
mmcv's ``aligned=True`` exactly in OpenVINO too.
"""

import importlib
import importlib.metadata
import importlib.util
import logging
import os.path as osp
from typing import Any, Dict, Optional, Sequence

import torch
from mmdeploy.backend.base import BACKEND_MANAGERS, BACKEND_WRAPPER, BaseBackendManager, BaseWrapper
from mmdeploy.core import FUNCTION_REWRITER
from mmdeploy.utils import get_root_logger

from ..openvino import OpenVINOSession, convert_onnx

# mmdeploy's own OpenVINO manager registers when this is imported (mmdeploy imports it again on
# every lookup): imported first, so that the registration below is the one that stays
importlib.import_module('mmdeploy.backend.openvino')


class OpenVINOWrapper(BaseWrapper):
    """An OpenVINO IR (``.xml``, the ``.bin`` beside it) compiled for the CPU in float32;
    ``forward({'input': tensor})`` -> ``{output name: tensor}``."""

    def __init__(self, ir_model_file: str, output_names: Optional[Sequence[str]] = None, threads=0):
        self.session = OpenVINOSession(ir_model_file, threads)
        names = [o.get_any_name() for o in self.session.compiled.outputs]
        super().__init__(list(output_names) if output_names else names)
        self._graph_names = names

    def forward(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        outs = self.session.run(
            None, {k: v.detach().cpu().float().numpy() for k, v in inputs.items()}
        )
        by_name = dict(zip(self._graph_names, outs))
        return {name: torch.from_numpy(by_name[name]) for name in self.output_names}


class OpenVINOManager(BaseBackendManager):
    """mmdeploy's backend manager for OpenVINO 2023+ (see the module docstring)."""

    @classmethod
    def build_wrapper(
        cls,
        backend_files: Sequence[str],
        device: str = 'cpu',
        input_names: Optional[Sequence[str]] = None,
        output_names: Optional[Sequence[str]] = None,
        deploy_cfg: Optional[Any] = None,
        **kwargs,
    ):
        # as many inference threads as torch (OMP_NUM_THREADS), as mmrepa's tools give
        # onnxruntime and OpenVINO; OpenVINO's own default is every core
        return OpenVINOWrapper(backend_files[0], output_names, torch.get_num_threads())

    @classmethod
    def is_available(cls, with_custom_ops: bool = False) -> bool:
        return importlib.util.find_spec('openvino') is not None

    @classmethod
    def get_version(cls) -> str:
        try:
            return importlib.metadata.version('openvino')
        except importlib.metadata.PackageNotFoundError:
            return 'None'

    @classmethod
    def to_backend(
        cls,
        ir_files: Sequence[str],
        work_dir: str,
        deploy_cfg: Any,
        log_level: int = logging.INFO,
        device: str = 'cpu',
        **kwargs,
    ) -> Sequence[str]:
        files = []
        for onnx_path in ir_files:
            xml = osp.join(work_dir, osp.splitext(osp.basename(onnx_path))[0] + '.xml')
            convert_onnx(onnx_path, xml)
            files.append(xml)
        return files


_log = get_root_logger()
_level = _log.level
_log.setLevel(logging.WARNING)  # not the INFO line 'already registered': replacing it is the point
try:
    BACKEND_MANAGERS.register('openvino')(OpenVINOManager)
finally:
    _log.setLevel(_level)
BACKEND_WRAPPER.register_module('openvino', module=OpenVINOWrapper, force=True)

_ROI_EXTRACTOR = 'mmdeploy.codebase.mmdet.models.roi_heads.single_level_roi_extractor'
if importlib.util.find_spec('mmdet') is not None:
    _stale = importlib.import_module(_ROI_EXTRACTOR).single_roi_extractor__forward__openvino
    FUNCTION_REWRITER._registry.remove_record(_stale)
