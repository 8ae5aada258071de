"""Export a whole folded model with mmdeploy to ONNX Runtime or OpenVINO, and check it against
PyTorch.

    python tools/deploy.py CONFIG CHECKPOINT DEPLOY_CFG --out DIR [--image IMG] [--force]

The model is folded first (:func:`mmrepa.fold_model`); DIR/folded.pth holds the folded weights
and DIR/model_cfg.py the config that builds them (``model.backbone.deploy=True``). mmdeploy's
``torch2onnx`` exports that to DIR/end2end.onnx with the rewrites of
:mod:`mmrepa.integrations.mmdeploy`; for OpenVINO, mmdeploy's backend manager (mmrepa's current
one, :mod:`mmrepa.integrations.mmdeploy.openvino`) converts it to DIR/end2end.xml and .bin. Then
the backend (through mmdeploy's backend model, post-processing included) and the folded PyTorch
model run on IMG (default: the first image of the config's test set) and the largest
differences are reported (DIR/report.json, ``<backend>_vs_pytorch``): boxes
(px) and scores, labels and mask IoU for mmdet models, differing pixels of the class map for
mmseg ones. The tool fails if they exceed the tolerances.

DEPLOY_CFG: ``configs/deploy/detection_<backend>_static.py`` (RetinaNet, Faster R-CNN, ...),
``instance-seg_<backend>_static.py`` (Mask R-CNN, ...), ``segmentation_<backend>_static.py``
(UperNet, ...), ``<backend>``: ``onnxruntime`` or ``openvino``. A backend that is not installed
is named in one line; a model the deploy config cannot export is refused with the reason before
anything is written. DIR appears complete or not at all: everything is written to a temporary
directory beside it and moved in place at the end (an existing DIR needs --force). DIR may not
be an input (CONFIG, CHECKPOINT, DEPLOY_CFG, IMG, the test data) or hold one, even with
--force: replacing it would delete them (a training work dir holds the checkpoint and its log).
"""

import argparse
import contextlib
import copy
import logging
import os.path as osp
import warnings

import torch
from mmengine.config import Config, DictAction

import mmrepa
from mmrepa.apis import build_model, init_model, load_config
from mmrepa.checkpoint import save_atomically
from mmrepa.config.inputs import config_inputs
from mmrepa.config.paths import find_config
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.outputs import check_outputs
from mmrepa.integrations.optional import require
from mmrepa.utils.files import atomic_folder, write_json
from mmrepa.utils.progress import step

TOOL = 'tools/deploy.py'
# the (codebase, task) pairs this tool compares, and the deploy config for each kind of model
TASKS = {('mmdet', 'ObjectDetection'), ('mmseg', 'Segmentation')}
# the backends this tool runs: name -> (what the user reads, the module it needs)
BACKENDS = {'onnxruntime': ('ONNX Runtime', 'onnxruntime'), 'openvino': ('OpenVINO', 'openvino')}


def deploy_config_for(kind: str, backend: str) -> str:
    """The deploy config of ``configs/deploy/`` for a kind of model ('detection',
    'instance-seg', 'segmentation') and a backend."""
    return f'configs/deploy/{kind}_{backend}_static.py'


class CannotExport(Exception):
    """The model cannot be exported with this deploy config (the message says why)."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', action=ConfigPath)
    parser.add_argument('checkpoint')
    parser.add_argument('deploy_cfg', help='an mmdeploy config, e.g. from configs/deploy/')
    parser.add_argument('--out', required=True, help='output directory')
    parser.add_argument('--image', help="default: the first image of the config's test set")
    parser.add_argument('--force', action='store_true', help='replace an existing --out')
    parser.add_argument(
        '--atol',
        type=float,
        default=1e-3,
        help='largest box (px) and score difference allowed (default 1e-3)',
    )
    parser.add_argument('--min-mask-iou', type=float, default=0.99)
    parser.add_argument(
        '--max-pixel-diff',
        type=float,
        default=0.0,
        help='largest fraction of differing class-map pixels (default 0)',
    )
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, help='override entries of CONFIG'
    )
    parser.add_argument('--verbose', action='store_true', help="show mmdeploy's log")
    return parser.parse_args(argv)


def _kind(model_cfg) -> str:
    """'instance-seg', 'detection' or 'segmentation', from the model config's structure."""
    model = model_cfg.get('model') or {}
    if model.get('decode_head') is not None:
        return 'segmentation'
    if (model.get('roi_head') or {}).get('mask_head') is not None or model.get('mask_head'):
        return 'instance-seg'
    return 'detection'


def check_exportable(cfg: Config, deploy_cfg: Config) -> None:
    """Raise :class:`CannotExport` naming why ``deploy_cfg`` cannot export ``cfg``'s model to
    ONNX Runtime here; return if it can."""
    from mmdeploy.utils import get_backend, get_codebase_config, is_dynamic_shape

    model = cfg.get('model') or {}
    name = model.get('type', '?')
    scope = model.get('_scope_') or cfg.get('default_scope') or '?'
    backend = get_backend(deploy_cfg).value
    if backend not in BACKENDS:
        raise CannotExport(
            f'its backend is {backend}; this tool exports for {" and ".join(BACKENDS)} and '
            "runs it (mmdeploy's tools/deploy.py converts to other backends)"
        )
    codebase = get_codebase_config(deploy_cfg)
    task = (codebase.get('type'), codebase.get('task'))
    if task not in TASKS:
        raise CannotExport(
            f'it exports {task[0]} {task[1]} models; this tool checks mmdet '
            'ObjectDetection and mmseg Segmentation models'
        )
    kind = _kind(cfg)
    if scope != task[0]:
        hint = (
            f'; use {deploy_config_for(kind, backend)}'
            if scope in ('mmdet', 'mmseg')
            else ' (this tool exports mmdet detectors and mmseg segmentors)'
        )
        raise CannotExport(
            f"the model is {scope}'s {name}, but the deploy config exports "
            f'{task[0]} {task[1]} models{hint}'
        )
    outputs = list((deploy_cfg.get('onnx_config') or {}).get('output_names') or [])
    if task[0] == 'mmdet' and (kind == 'instance-seg') != ('masks' in outputs):
        raise CannotExport(
            f'the {name} {"predicts" if kind == "instance-seg" else "has no"} masks, but the '
            f"deploy config's outputs are {outputs}; use {deploy_config_for(kind, backend)}"
        )
    if is_dynamic_shape(deploy_cfg):
        raise CannotExport(
            "it asks for dynamic input sizes (onnx_config.dynamic_axes); mmrepa's window "
            'attention computes its window layout (padding, shift, partition) from the map size '
            'and the exported graph holds it as constants of the traced size, so the graph '
            'would be wrong at any other size. Use a static config (configs/deploy/*_static.py) '
            'and export once per input size'
        )


def _first_test_image(cfg: Config) -> str:
    from mmengine.registry import DATASETS, init_default_scope

    init_default_scope(cfg.get('default_scope', 'mmdet'))
    dataset_cfg = copy.deepcopy(cfg.test_dataloader.dataset)
    dataset_cfg['pipeline'] = []
    dataset = DATASETS.build(dataset_cfg)
    if len(dataset) == 0:
        raise CannotExport(f'its test set ({dataset_cfg.get("data_root")}) is empty; pass --image')
    return dataset.get_data_info(0)['img_path']


@contextlib.contextmanager
def _quiet(verbose: bool):
    """Unless ``verbose``: mmdeploy's and mmengine's INFO / WARNING log (registry fallbacks,
    deprecations) and Python warnings (mmdet's deprecations, the exporter's notes) off. The
    check against PyTorch is what tells whether the export is right."""
    from mmengine.logging import MMLogger

    if verbose:
        yield
        return
    loggers = [logging.getLogger('mmdeploy'), MMLogger.get_current_instance()]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f'{type(err).__name__}: {lines[0][:300] if lines else ""}'.rstrip(': ')


def fold_and_save(cfg: Config, checkpoint: str, work_dir: str):
    """The folded model (eval mode), and the config + weights files that rebuild it folded."""
    model = init_model(cfg, checkpoint)
    report = mmrepa.fold_model(model, logger=None)
    model = report.model
    folded_cfg = copy.deepcopy(cfg)
    folded_cfg.model.backbone.deploy = True
    # the folded weights must load into the config's deploy=True structure as they are
    # (mmdeploy loads checkpoints leniently: a mismatch would go unnoticed)
    try:
        build_model(folded_cfg).load_state_dict(model.state_dict(), strict=True)
    except (RuntimeError, TypeError, ValueError) as err:
        raise CannotExport(
            'the folded model does not rebuild from its config with '
            f'model.backbone.deploy=True ({_first_line(err)})'
        ) from None
    weights = osp.join(work_dir, 'folded.pth')
    meta = dict(
        dataset_meta=getattr(model, 'dataset_meta', None),
        mmrepa=dict(deploy=True, version=mmrepa.__version__, source=osp.abspath(checkpoint)),
    )
    save_atomically(dict(meta=meta, state_dict=model.state_dict()), weights)
    folded_cfg.dump(osp.join(work_dir, 'model_cfg.py'))
    return model, folded_cfg, weights, report


def _match(a, b) -> list:
    """Pairs (i, j) of PyTorch instance i and ONNX Runtime instance j: greedily in PyTorch's
    order, the unpaired instance of the same label with the closest box (L-inf). Instances
    whose scores differ less than the float noise may come in either order; this pairs them
    by what they are, not by rank. j is None where no instance of that label is left."""
    pairs, free = [], torch.ones(len(b), dtype=torch.bool)
    for i in range(len(a)):
        dist = (b.bboxes.to(a.bboxes) - a.bboxes[i]).abs().amax(-1)
        dist[(b.labels.long() != a.labels[i].long()) | ~free] = float('inf')
        j = int(dist.argmin()) if len(b) else None
        if j is None or not torch.isfinite(dist[j]):
            pairs.append((i, None))
            continue
        free[j] = False
        pairs.append((i, j))
    return pairs


def compare(ref, out, backend: str = 'onnxruntime') -> dict:
    """The largest differences between a PyTorch and a ``backend`` prediction (one image):
    differing pixels of the class maps; or, instance by instance (see :func:`_match`), boxes
    (px), scores and mask IoU, and whether every instance has its counterpart of the same
    label."""
    if 'pred_sem_seg' in ref:
        a = ref.pred_sem_seg.data
        b = out.pred_sem_seg.data.to(a)
        if a.shape != b.shape:
            return dict(shape_pytorch=list(a.shape), **{f'shape_{backend}': list(b.shape)})
        differing = int((a != b).sum())
        return dict(
            pixels=a.numel(), differing_pixels=differing, differing_fraction=differing / a.numel()
        )
    a, b = ref.pred_instances, out.pred_instances
    result = dict(num_pytorch=len(a), **{f'num_{backend}': len(b)})
    if len(a) != len(b) or not len(a):
        return result
    pairs = _match(a, b)
    result['labels_equal'] = all(j is not None for _, j in pairs)
    if not result['labels_equal']:
        return result
    i, j = (torch.tensor(x) for x in zip(*pairs))
    result.update(
        max_box_diff=float((a.bboxes[i] - b.bboxes[j].to(a.bboxes)).abs().max()),
        max_score_diff=float((a.scores[i] - b.scores[j].to(a.scores)).abs().max()),
    )
    if 'masks' in a and 'masks' in b:
        ma, mb = a.masks[i].bool().flatten(1), b.masks[j].bool().flatten(1)
        inter, union = (ma & mb).sum(1).float(), (ma | mb).sum(1).float()
        iou = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))
        result['min_mask_iou'] = float(iou.min())
    return result


def disagreement(result: dict, args, backend: str = 'onnxruntime') -> str:
    """'' if ``result`` is within the tolerances, else what is not."""
    if 'shape_pytorch' in result:
        return f'class maps of different shapes {result}'
    if 'differing_fraction' in result:
        if result['differing_fraction'] > args.max_pixel_diff:
            return (
                f'{result["differing_pixels"]} of {result["pixels"]} class-map pixels '
                f'differ (> {args.max_pixel_diff:g})'
            )
        return ''
    if result['num_pytorch'] != result[f'num_{backend}']:
        return (
            f'PyTorch predicts {result["num_pytorch"]} instances, {BACKENDS[backend][0]} '
            f'{result[f"num_{backend}"]}'
        )
    problems = []
    if result.get('max_box_diff', 0) > args.atol:
        problems.append(f'boxes differ by {result["max_box_diff"]:.2e} px > {args.atol:g}')
    if result.get('max_score_diff', 0) > args.atol:
        problems.append(f'scores differ by {result["max_score_diff"]:.2e} > {args.atol:g}')
    if not result.get('labels_equal', True):
        problems.append('some instances have no counterpart of the same label')
    if result.get('min_mask_iou', 1.0) < args.min_mask_iou:
        problems.append(f'a mask IoU is {result["min_mask_iou"]:.4f} < {args.min_mask_iou:g}')
    return '; '.join(problems)


def run_backend(
    model, folded_cfg: Config, deploy_cfg: Config, onnx_file: str, image: str, work_dir: str
):
    """Convert the exported ``onnx_file`` to the deploy config's backend (in ``work_dir``; ONNX
    Runtime runs the file itself), run it through mmdeploy's backend model and the folded
    PyTorch ``model`` on ``image``, and compare them (:func:`compare`). Returns (the comparison,
    the backend's files, the network input's (H, W))."""
    from mmdeploy.backend.base import get_backend_manager
    from mmdeploy.utils import get_backend, get_input_shape

    from mmrepa.integrations.mmdeploy.deployed import build_backend_model

    backend = get_backend(deploy_cfg).value
    files = [onnx_file]
    if backend != 'onnxruntime':  # mmdeploy's step from the ONNX graph to the backend's files
        files = get_backend_manager(backend).to_backend(files, work_dir, deploy_cfg)
    processor, backend_model = build_backend_model(folded_cfg, deploy_cfg, files)
    inputs, _ = processor.create_input(image, get_input_shape(deploy_cfg))
    with torch.no_grad():
        ref = model.test_step(copy.deepcopy(inputs))[0]
        out = backend_model.test_step(copy.deepcopy(inputs))[0]
    return compare(ref, out, backend), files, list(inputs['inputs'][0].shape[-2:])


def export_and_compare(args, cfg: Config, deploy_cfg: Config, image: str, work_dir: str) -> dict:
    from mmdeploy.apis import torch2onnx
    from mmdeploy.utils import get_backend

    with step(TOOL, 'folding the model'):
        model, folded_cfg, weights, fold = fold_and_save(cfg, args.checkpoint, work_dir)
    onnx_file = osp.join(work_dir, 'end2end.onnx')
    try:
        with step(TOOL, 'exporting to ONNX with mmdeploy'):
            torch2onnx(
                image, work_dir, 'end2end.onnx', deploy_cfg, folded_cfg, weights, device='cpu'
            )
    except Exception as err:  # mmdeploy, its rewrites and torch.onnx raise anything
        raise CannotExport(
            f'mmdeploy could not export the folded {cfg.model.type} ({_first_line(err)})'
        ) from None
    if not osp.isfile(onnx_file):
        raise CannotExport(f'mmdeploy wrote no {osp.basename(onnx_file)}')
    backend = get_backend(deploy_cfg).value
    with step(TOOL, f'converting for {backend} and comparing it with PyTorch'):
        result, files, input_shape = run_backend(
            model, folded_cfg, deploy_cfg, onnx_file, image, work_dir
        )
    report = dict(
        config=osp.abspath(args.config),
        checkpoint=osp.abspath(args.checkpoint),
        deploy_cfg=osp.abspath(args.deploy_cfg),
        image=osp.abspath(image),
        backend=backend,
        backend_files=[osp.basename(f) for f in files],
        input_shape=input_shape,
        folded=fold.folded,
        params_before=fold.params_before,
        params_after=fold.params_after,
        **{f'{backend}_vs_pytorch': result},
    )
    deploy_cfg.dump(osp.join(work_dir, 'deploy_cfg.py'))
    write_json(report, osp.join(work_dir, 'report.json'))
    return report


@one_line_errors(TOOL)
def main(argv=None) -> dict:
    """Returns the report (also DIR/report.json)."""
    args = parse_args(argv)
    find_config(args.config)  # a missing one: the closest configs
    for path in (args.config, args.checkpoint, args.deploy_cfg, args.image):
        if path is not None and not osp.isfile(path):
            raise FileNotFoundError(f'no such file: {path}')
    outputs = [('--out', args.out, True)]
    check_outputs(
        TOOL,
        outputs,
        [
            ('config', args.config),
            ('checkpoint', args.checkpoint),
            ('deploy config', args.deploy_cfg),
            ('image', args.image),
        ],
        args.force,
    )
    require('mmdeploy', 'aenum', 'onnx', tool=TOOL)
    import mmrepa.integrations.mmdeploy  # noqa: F401  (mmrepa's rewrites for mmdeploy)

    deploy_cfg = Config.fromfile(args.deploy_cfg)
    backend = (deploy_cfg.get('backend_config') or {}).get('type')
    if backend in BACKENDS:  # the one line naming what to install, before anything is read
        require(BACKENDS[backend][1], tool=TOOL)
    cfg = load_config(args.config, args.cfg_options)
    check_outputs(TOOL, outputs, config_inputs(cfg, () if args.image else ('test',)), args.force)
    try:  # DIR whole or not at all: a temporary folder beside it, moved in place at the end
        with atomic_folder(args.out, replace=True) as tmp:
            with _quiet(args.verbose):
                check_exportable(cfg, deploy_cfg)
                image = args.image or _first_test_image(cfg)
                report = export_and_compare(args, cfg, deploy_cfg, image, tmp)
            problem = disagreement(report[f'{backend}_vs_pytorch'], args, backend)
            if problem:
                raise SystemExit(
                    f'{TOOL}: the exported model disagrees with PyTorch on '
                    f'{image}: {problem}; nothing written to {args.out}'
                )
    except CannotExport as err:
        raise SystemExit(
            f'{TOOL}: cannot export {args.config} with {args.deploy_cfg}: '
            f'{err}; nothing written to {args.out}'
        ) from None
    result = report[f'{backend}_vs_pytorch']
    print(
        f'exported the folded {cfg.model.type} ({report["params_after"] / 1e6:.2f} M '
        f'parameters) to {", ".join(osp.join(args.out, f) for f in report["backend_files"])}, '
        f'traced at '
        f'{report["input_shape"][0]} x {report["input_shape"][1]}'
    )
    print(
        f'{backend} vs PyTorch on '
        + osp.basename(report['image'])
        + ': '
        + ', '.join(
            f'{k} {v:.2e}' if isinstance(v, float) else f'{k} {v}' for k, v in result.items()
        )
    )
    return report


if __name__ == '__main__':
    main()
