"""Building a model from any mmrepa config, for the tools (mmdet and mmseg configs alike)."""

import argparse
import contextlib
import copy
import importlib
import os
import os.path as osp
import subprocess
import tempfile
import warnings
from typing import Iterator, Optional, Union

import mmcv
import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config, DictAction
from mmengine.dataset import Compose, pseudo_collate
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from .errors import ConfigError, MMRepaError
from .fold import reparameterize
from .integrations.cli.config_checks import check_checkpoint_fit, check_types


def _mmrepa_types() -> set:
    from mmengine.registry import HOOKS, MODELS

    return {
        name
        for registry in (MODELS, HOOKS)
        for name, cls in registry.module_dict.items()
        if cls.__module__.startswith('mmrepa.')
    }


def _types_in(node) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            yield node['type']
        for value in node.values():
            yield from _types_in(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _types_in(value)


def check_custom_imports(cfg: Config) -> None:
    """Refuse a config that uses mmrepa modules without importing mmrepa itself.

    Our tools import mmrepa anyway, but mmdet's and mmseg's tools would fail on such a config
    with an unhelpful "not in the registry" error; say what to add instead.
    """
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    if any(i == 'mmrepa' or i.startswith('mmrepa.') for i in imports):
        return
    used = sorted(set(_types_in(cfg.to_dict())) & _mmrepa_types())
    if used:
        raise ConfigError(
            f'config {cfg.filename} uses {", ".join(used)} from mmrepa but does not import '
            "mmrepa: add custom_imports = dict(imports=['mmrepa'], allow_failed_imports=False) "
            'to it (mmdet and mmseg tools need it to find these modules).'
        )


def check_classifier(cfg: Config) -> None:
    """Refuse an mmpretrain classifier whose backbone gives several feature maps to a neck and
    head that use one: ``GlobalAveragePooling`` pools each map and the head reads the last, so
    the other stages' outputs (and their norms) would be computed, trained and never used."""
    model = cfg.get('model') or {}
    backbone, neck = model.get('backbone') or {}, model.get('neck') or {}
    out_indices = backbone.get('out_indices')
    if (
        model.get('type') == 'ImageClassifier'
        and neck.get('type') == 'GlobalAveragePooling'
        and out_indices is not None
        and len(out_indices) != 1
    ):
        raise ConfigError(
            f'config {cfg.filename}: model.backbone.out_indices={tuple(out_indices)} gives '
            f"{len(out_indices)} feature maps, but the classifier's GlobalAveragePooling neck "
            "and head use one (the last stage's): set out_indices=(3, ) (or the index of the "
            'stage to classify from).'
        )


def load_config(config: str, cfg_options: Optional[dict] = None) -> Config:
    """``Config.fromfile`` + ``--cfg-options`` + :func:`check_custom_imports`,
    :func:`check_classifier` and
    :func:`mmrepa.integrations.cli.config_checks.check_types` (every model type
    registered, else "did you mean")."""
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    check_custom_imports(cfg)
    check_classifier(cfg)
    check_types(cfg)
    return cfg


def tool_argument_parser(description: str, distributed: bool = True) -> argparse.ArgumentParser:
    """A parser with the arguments the runner tools share: ``config`` (the first positional;
    add the tool's own after it), ``--work-dir``, ``--cfg-options`` and, if ``distributed``,
    ``--launcher`` and ``--local_rank``. Apply them with :func:`tool_config`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', help='config file')
    parser.add_argument(
        '--work-dir',
        help='where logs (and checkpoints) go; default: the '
        "config's work_dir, else ./work_dirs/CONFIG_NAME",
    )
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. model.backbone.idle_ratio=0.5 '
        'train_dataloader.batch_size=8',
    )
    parser.add_argument(
        '--data-root',
        metavar='DIR',
        help="use the data in DIR: COCO-format annotations (mmdet), ADE20K's "
        'layout (mmseg), a folder per class (mmpretrain); the classes come from '
        "the data and every head's num_classes follows (see mmrepa/integrations/cli/own_data.py)",
    )
    parser.add_argument(
        '--classes',
        type=lambda s: s.split(','),
        metavar='A,B,C',
        help='with --data-root: the class names of segmentation label maps '
        '(else DIR/classes.txt); for COCO data, the categories to keep',
    )
    if distributed:
        parser.add_argument(
            '--launcher',
            choices=['none', 'pytorch', 'slurm', 'mpi'],
            default='none',
            help='job launcher for distributed runs',
        )
        # torch.distributed.launch passes --local-rank (older: --local_rank)
        parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def tool_config(args: argparse.Namespace) -> Config:
    """The config of :func:`tool_argument_parser`'s arguments: :func:`load_config` with
    ``--cfg-options``, ``work_dir`` (``--work-dir``, else the config's, else
    ``./work_dirs/CONFIG_NAME``), ``launcher`` and, after ``--cfg-options``, ``--data-root``
    (:func:`mmrepa.integrations.cli.own_data.use_own_data`). Builds nothing and starts no
    process group
    (call :func:`setup_cpu_distributed` when the tool is ready to)."""
    cfg = load_config(args.config, args.cfg_options)
    if getattr(args, 'data_root', None):
        from .integrations.cli.own_data import use_own_data

        print(use_own_data(cfg, args.data_root, args.classes), flush=True)
    elif getattr(args, 'classes', None):
        raise ConfigError('--classes goes with --data-root')
    cfg.work_dir = (
        args.work_dir
        or cfg.get('work_dir')
        or osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    )
    if hasattr(args, 'launcher'):
        cfg.launcher = args.launcher
        os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return cfg


def tool_message(tool: str, err: BaseException) -> str:
    """``err``'s message as a tool prints it: ``TOOL: message`` (not twice if the message
    already starts with it: the checks that take the tool's name, such as
    :func:`mmrepa.integrations.cli.inputs.check_inputs`, put it there)."""
    message = str(err) or type(err).__name__
    return message if message.startswith(f'{tool}: ') else f'{tool}: {message}'


@contextlib.contextmanager
def one_line_errors(tool: str):
    """Stop a tool with one line (one per problem, when the error lists several) and exit
    status 1, no traceback, on the errors whose message already names the file, option or key
    and the fix: every :class:`~mmrepa.errors.MMRepaError` (a config that cannot work, an
    unusable checkpoint, a model that cannot be folded, an input or command-line value the tool
    cannot use, a missing optional package) and a missing file. Usable as a decorator of a
    tool's ``main``.

    This is where mmrepa's errors become an exit status: the library raises them and never
    ``SystemExit`` (see :mod:`mmrepa.errors`)."""
    try:
        yield
    except (FileNotFoundError, MMRepaError) as err:
        raise SystemExit(tool_message(tool, err)) from None


def _slurm_to_torch_env() -> None:
    """The rendezvous variables torch reads, from Slurm's (as mmengine's slurm launcher)."""
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
    os.environ.setdefault('MASTER_PORT', '29500')
    if 'MASTER_ADDR' not in os.environ:
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f'scontrol show hostname {os.environ["SLURM_NODELIST"]} | head -n1'
        )


def setup_cpu_distributed(cfg: Config) -> None:
    """Let ``--launcher pytorch`` or ``slurm`` run on machines without CUDA (gloo backend).

    mmengine 0.10's launchers call ``torch.cuda.set_device`` and wrap DDP with CUDA
    ``device_ids``; without a GPU we initialise the process group ourselves (mmengine then
    skips its own) and build DDP without device ids.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher not in ('pytorch', 'slurm') or torch.cuda.is_available():
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        if launcher == 'slurm':
            _slurm_to_torch_env()
        backend = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('backend', 'gloo')
        dist.init_process_group(backend='gloo' if backend == 'nccl' else backend)
    wrapper = dict(
        type='MMDistributedDataParallel',
        broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False),
    )
    wrapper.update(cfg.get('model_wrapper_cfg') or {})
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper


def _num_classes(cfg: Config) -> Optional[int]:
    """The number of classes the config's model predicts (its main head's ``num_classes``)."""
    model = cfg.model
    heads = [model.get('decode_head'), model.get('bbox_head')]
    roi = (model.get('roi_head') or {}).get('bbox_head')
    heads.append(roi[-1] if isinstance(roi, (list, tuple)) else roi)  # cascade: the last stage
    for head in heads:
        if isinstance(head, dict) and isinstance(head.get('num_classes'), int):
            return head['num_classes']
    return None


def _config_dataset_meta(cfg: Config, registry) -> dict:
    """The metainfo (classes, palette) of the config's test data set, built lazily (no
    annotation is read), as mmdet's ``init_detector`` finds its palette; ``{}`` if the config
    has no data set that builds."""
    for loader in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        dataset = (cfg.get(loader) or {}).get('dataset')
        if not isinstance(dataset, dict):
            continue
        dataset = copy.deepcopy(dataset)
        dataset['lazy_init'] = True
        try:
            return dict(registry.DATASETS.build(dataset).metainfo)
        except Exception:  # noqa: BLE001  a data set type the scope lacks, a wrapper, ...
            continue
    return {}


def _random_palette(n: int) -> list:
    # fixed seed: the same colours on every run and in every tool
    rng = np.random.default_rng(42)
    return [tuple(int(c) for c in rng.integers(0, 256, 3)) for _ in range(n)]


def _dataset_meta(
    cfg: Config, registry, checkpoint: Optional[dict], checkpoint_path: Optional[str]
) -> dict:
    """``model.dataset_meta`` for mmdet's and mmseg's inference and visualizers: the
    checkpoint's ``meta['dataset_meta']`` (what the runner saved from the training set), else
    the config's test data set, else class names made from the head's ``num_classes``. A
    checkpoint without class names is warned about. Always has ``classes`` and a palette
    list of the same length (mmseg's visualizer indexes it; mmdet's accepts a list)."""
    meta = (checkpoint or {}).get('meta') or {}
    if 'dataset_meta' in meta:
        found = {k.lower(): v for k, v in meta['dataset_meta'].items()}  # mmdet 3 lowercases
    elif 'CLASSES' in meta:  # checkpoints of mmdet 2 / mmseg 0.x
        found = dict(classes=meta['CLASSES'])
        if meta.get('PALETTE') is not None:
            found['palette'] = meta['PALETTE']
    else:
        found = {}
    from_config = _config_dataset_meta(cfg, registry)
    if not found.get('classes'):
        if from_config.get('classes'):
            found = dict(from_config)
            source = f"the config's test data set ({len(found['classes'])} classes)"
        else:
            n = _num_classes(cfg) or 1
            found = dict(classes=tuple(f'class_{i}' for i in range(n)))
            source = f'class_0 .. class_{n - 1} (the head has {n} classes)'
        if checkpoint_path:  # no warning for random weights (benchmarks, FLOP counts)
            warnings.warn(
                f'checkpoint {checkpoint_path} has no dataset_meta (class names) in '
                f'its meta; using {source}',
                stacklevel=3,
            )
    classes = list(found['classes'])
    predicted = _num_classes(cfg)
    if predicted and predicted != len(classes):
        warnings.warn(
            f'dataset_meta names {len(classes)} classes but the model predicts '
            f'{predicted}: labels will be drawn with the wrong names',
            stacklevel=3,
        )
    palette = found.get('palette')
    if not isinstance(palette, (list, tuple)) or len(palette) < len(classes):
        palette = from_config.get('palette')
        if palette is None or tuple(from_config.get('classes') or ()) != tuple(classes):
            palette = _random_palette(len(classes))
    found['palette'] = [tuple(c) for c in palette[: len(classes)]]
    return found


def build_model(cfg: Config) -> nn.Module:
    """Build ``cfg.model`` in the config's default scope as mmengine's Runner does: a top-level
    ``data_preprocessor`` (where mmpretrain configs keep it) goes into the model. SyncBN is
    reverted to BN (outside a process group it cannot run)."""
    scope = cfg.get('default_scope', 'mmengine')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry')
    model_cfg = copy.deepcopy(cfg.model)
    if cfg.get('data_preprocessor') is not None:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    return revert_sync_batchnorm(registry.MODELS.build(model_cfg))


def init_model(
    config: Union[str, Config],
    checkpoint: Optional[str] = None,
    device: Union[str, torch.device] = 'cpu',
    cfg_options: Optional[dict] = None,
    reparam: bool = False,
) -> nn.Module:
    """Build the config's model in its default scope, load ``checkpoint``, eval mode; with
    ``reparam=True`` fold it (:func:`mmrepa.reparameterize`).

    SyncBN is reverted to BN (outside a process group it cannot run). The backbone's
    ``init_cfg`` weights are not loaded; ``checkpoint`` is, strictly. The model gets what
    mmdet's ``inference_detector`` / ``DetInferencer`` and mmseg's ``inference_model`` /
    ``MMSegInferencer`` read, as their own loaders set it: ``model.cfg`` (the config) and
    ``model.dataset_meta`` (``classes`` and ``palette``, from the checkpoint's
    ``meta['dataset_meta']``; without it from the config's test data set, with a warning).
    The folded model takes the same inputs and gives the same predictions as the unfolded one.
    """
    if isinstance(config, str):
        cfg = load_config(config, cfg_options)
    else:
        cfg = copy.deepcopy(config)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    model = build_model(cfg)
    registry = importlib.import_module(f'{cfg.get("default_scope", "mmengine")}.registry')
    loaded = None
    if checkpoint:
        if isinstance(getattr(model, 'backbone', None), nn.Module) and osp.isfile(checkpoint):
            # another model's checkpoint: one line, not mmengine's lists of keys
            check_checkpoint_fit(model.backbone, checkpoint, 'checkpoint')
        loaded = load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
    model.eval()
    if reparam:
        model = reparameterize(model)
    model.cfg = cfg
    model.dataset_meta = _dataset_meta(cfg, registry, loaded, checkpoint)
    return model.to(device)


DEFAULT_INPUT_SHAPES = {'mmseg': (512, 512), 'mmpretrain': (224, 224)}


def default_input_shape(cfg: Config) -> tuple:
    """The (H, W) the tools measure a config's model at, unless told: the papers' sizes,
    512 x 512 for segmentation, 224 x 224 for classification (32 x 32 on CIFAR), 800 x 1333
    for detection."""
    dataset = ((cfg.get('train_dataloader') or {}).get('dataset') or {}).get('type', '')
    if cfg.get('default_scope') == 'mmpretrain' and str(dataset).startswith('CIFAR'):
        return (32, 32)
    return DEFAULT_INPUT_SHAPES.get(cfg.get('default_scope'), (800, 1333))


def pipeline_batch(cfg: Config, shape) -> dict:
    """A batch of one random ``shape`` (H, W) image through the config's test pipeline (its
    annotation loading left out), as the test dataloader would give it. A pipeline that loads
    no file (CIFAR: the data set holds the arrays) gets the image array itself."""
    steps = [
        t
        for t in cfg.test_dataloader.dataset.pipeline
        if not t['type'].startswith('LoadAnnotations')
    ]
    image = np.random.default_rng(0).integers(0, 256, size=(*shape, 3), dtype=np.uint8)
    results = dict(img_id=0, seg_fields=[], reduce_zero_label=False)
    if not any(t['type'].startswith('LoadImage') for t in steps):
        return pseudo_collate(
            [
                Compose(steps)(
                    dict(results, img=image, img_shape=tuple(shape), ori_shape=tuple(shape))
                )
            ]
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'image.png')
        mmcv.imwrite(image, path)
        data = Compose(steps)(dict(results, img_path=path))
    return pseudo_collate([data])
