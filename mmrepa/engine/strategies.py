"""Sharded training with mmengine's ``FlexibleRunner``: ``FSDPStrategy`` made to run without
CUDA and to keep every foldable block in one FSDP unit, and the auto-wrap policy at block
granularity.

mmengine's ``FSDPStrategy`` is used as it is except where it cannot work here: its
``_setup_distributed`` calls ``torch.cuda.set_device`` and its ``_wrap_model`` gives FSDP a CUDA
``device_id`` (both fail on a machine without CUDA, so CPU runs and CI could not shard at all),
and nothing stops an auto-wrap policy from putting part of a foldable block in one unit and
the rest in another. :class:`FoldableFSDPStrategy` changes those two steps and checks the
wrapped model, keeps FSDP's mixed precision from splitting blocks or rounding statistics,
builds the optimizer over whole tensors and gives a RepOpt optimizer the branch scales of its
rank's pieces; everything else (state dicts, optimizer sharding, checkpoints) is
mmengine's.
"""

import contextlib
import copy
import os
import os.path as osp
import subprocess
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine._strategy import FSDPStrategy
from mmengine.device import get_device
from mmengine.dist import get_rank, get_world_size, is_distributed
from mmengine.registry import FUNCTIONS, MODELS, STRATEGIES
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint.sharded import SHARD_META, rank_file
from ..errors import CheckpointError, ConfigError, DependencyError
from ..fold import Reparameterizable
from ..fold.checks import FOREIGN_FOLD_METHODS, _callable_without_arguments


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


def init_cpu_process_group(launcher: str, backend: str = 'gloo') -> None:
    """Initialise the process group without CUDA (gloo; 'nccl' becomes 'gloo'), as mmengine's
    ``init_dist`` does minus its ``torch.cuda.set_device``. A no-op when one exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if launcher == 'slurm':
        _slurm_to_torch_env()
    elif launcher != 'pytorch':
        raise ConfigError(
            f'launcher {launcher!r} cannot start a CPU run; use --launcher pytorch '
            '(tools/dist_train.sh, torchrun) or slurm'
        )
    dist.init_process_group(backend='gloo' if backend == 'nccl' else backend)


def is_foldable_block(module: nn.Module) -> bool:
    """Whether ``module``'s own fold combines tensors of its submodules (a RePa-Swin block, a
    joined block, a RepVGG layer; a foreign ``switch_to_deploy()`` / ``reparameterize()`` /
    ``fuse()``), so that all of it must be in one FSDP unit to be folded there. A backbone
    whose fold only folds its parts (``_fold_tensors`` not overridden) is not one."""
    if isinstance(module, Reparameterizable):
        return type(module)._fold_tensors is not Reparameterizable._fold_tensors
    return any(_callable_without_arguments(getattr(module, m, None)) for m in FOREIGN_FOLD_METHODS)


def split_blocks(model: nn.Module, unit_type: type) -> List[Tuple[str, str]]:
    """``(foldable block, unit inside it)`` names for every FSDP unit (a module of
    ``unit_type``) that lies strictly inside a foldable block of ``model``."""
    found = []
    for name, module in model.named_modules():
        if not is_foldable_block(module):
            continue
        for sub_name, sub in module.named_modules():
            if sub_name and isinstance(sub, unit_type):
                found.append((name, f'{name}.{sub_name}' if name else sub_name))
    return found


@FUNCTIONS.register_module()
def foldable_block_policy(
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    block_types: Iterable[str] = (),
) -> bool:
    """FSDP auto-wrap policy: one unit per module whose class name is in ``block_types``
    (e.g. ``('RePaSwinBlock',)``), everything else in its parent's unit. Name the outermost
    foldable blocks (or stages of them): :class:`FoldableFSDPStrategy` refuses a wrapping
    that puts part of a foldable block in a unit of its own.

    Config: ``model_wrapper=dict(auto_wrap_policy=dict(type='foldable_block_policy',
    block_types=['RePaSwinBlock']))``.
    """
    if recurse:
        return True  # look inside everything: the blocks may sit at any depth
    return type(module).__name__ in set(block_types)


@STRATEGIES.register_module()
class FoldableFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` that also runs on the CPU (gloo, for CI and CPU clusters)
    and refuses a wrapping that splits a foldable block.

    Arguments as ``FSDPStrategy``'s (``model_wrapper``, ``skip_init_weights``,
    ``activation_checkpointing``); prefer the backbones' ``with_cp`` (BatchNorm statistics
    kept through the recomputation) to ``activation_checkpointing``. ``state_dict_cfg``
    takes ``'sharded'`` (the default) besides mmengine's ``'full'`` and ``'local'``: every
    rank saves its own pieces as plain tensors (:mod:`mmrepa.checkpoint.sharded`), which a
    resume with the same number of ranks loads back exactly and
    ``tools/consolidate_checkpoint.py`` turns into an ordinary checkpoint. An ordinary
    checkpoint (``load_from``, a consolidated one) loads into the sharded model too.
    """

    def __init__(self, *, state_dict_cfg='sharded', **kwargs):
        # mmengine's 'local' saves ShardedTensors: loading one runs code and needs a process
        # group, which the restricted loader and offline tools cannot have
        self.plain_shards = state_dict_cfg == 'sharded'
        super().__init__(state_dict_cfg='local' if self.plain_shards else state_dict_cfg, **kwargs)

    def build_model(self, model):
        # kept to build an unsharded copy later (full_model): the wrapped model cannot be
        # copied, and runner.cfg.model lacks a top-level data_preprocessor
        self._model_cfg = copy.deepcopy(model) if isinstance(model, dict) else None
        return super().build_model(model)

    @torch.no_grad()
    def full_model(self) -> nn.Module:
        """An unsharded copy of the model with the gathered weights and buffers, on every
        rank, in eval mode (``ReparameterizeHook`` folds, verifies and tests it); the sharded
        model is not changed."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if self._model_cfg is None:
            raise ConfigError(
                'FoldableFSDPStrategy.full_model needs the model built from a config (a dict)'
            )
        model = MODELS.build(copy.deepcopy(self._model_cfg))
        with FSDP.summon_full_params(self.model, writeback=False):
            state = {_clean(n): p.detach().clone() for n, p in self.model.named_parameters()}
        state.update((n, b.detach().clone()) for n, b in self._buffers())
        model.load_state_dict(state, strict=True)
        return model.to(get_device()).eval()

    def _setup_distributed(self, launcher: str = 'pytorch', backend: str = 'nccl', **kwargs):
        if torch.cuda.is_available():
            return super()._setup_distributed(launcher, backend, **kwargs)
        if not is_distributed():
            init_cpu_process_group(launcher, backend)

    def _wrap_model(self, model: nn.Module) -> Optional[nn.Module]:
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel
        except ImportError as e:  # a torch built without distributed support
            raise DependencyError(
                f'FoldableFSDPStrategy needs torch.distributed.fsdp, which torch '
                f'{torch.__version__} does not have ({e}); install a torch with distributed '
                'support or train with DDP (the default Runner)'
            ) from None
        self.model_wrapper = dict(self.model_wrapper or dict(type='MMFullyShardedDataParallel'))
        if torch.cuda.is_available():
            # FSDPStrategy takes DDPStrategy's sync_bn but never applies it (SyncBN needs CUDA)
            model = self.convert_model(model)
        else:
            # mmengine passes device_id=LOCAL_RANK, a CUDA device: keep the CPU
            self.model_wrapper.setdefault('device_id', torch.device('cpu'))
        if isinstance(self.model_wrapper.get('mixed_precision'), dict):
            self.model_wrapper['mixed_precision'] = mixed_precision_for(
                model, self.model_wrapper['mixed_precision']
            )
        wrapped = super()._wrap_model(model)
        inner = wrapped.module if wrapped is not None else model
        split = split_blocks(inner, FullyShardedDataParallel)
        if split:
            block, unit = split[0]
            raise ConfigError(
                f'the FSDP auto-wrap policy puts {unit} in a unit of its own, which splits the '
                f'foldable block {block} ({type(inner.get_submodule(block)).__name__}; '
                f'{len(split)} such unit(s)): wrap whole blocks, e.g. '
                f"auto_wrap_policy=dict(type='foldable_block_policy', "
                f"block_types=['{type(inner.get_submodule(block)).__name__}'])"
            )
        return wrapped

    def build_optim_wrapper(self, optim_wrapper, model=None):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from .optimizers import RepOptOptimizer

        # a constructor sees whole tensors: mmengine's paramwise rules go by ndim (every piece
        # is 1-D, so flat_decay_mult would take the decay of every weight) and the RepOpt one
        # checks each kernel against its branch scales
        whole = (
            FSDP.summon_full_params(model, writeback=False)
            if isinstance(optim_wrapper, dict)  # a ConfigDict too
            else contextlib.nullcontext()
        )
        with whole:
            wrapper = super().build_optim_wrapper(optim_wrapper, model)
        for optim in getattr(wrapper, 'values', lambda: [wrapper])():
            _check_sharded_optimizer(optim)
            if isinstance(optim.optimizer, RepOptOptimizer):
                _attach_pieces(optim.optimizer, model)
        return wrapper

    # --- plain sharded checkpoints ('sharded') -------------------------------------------------

    def _pieces(self) -> Dict[str, Tuple[nn.Parameter, List[int], int, int]]:
        """``{name: (this rank's piece, full shape, start, end)}`` for every parameter."""
        where = _piece_ranges(self.model)
        return {
            _clean(name): (p, *where[p]) for name, p in self.model.named_parameters() if p in where
        }

    def _buffers(self) -> List[Tuple[str, torch.Tensor]]:
        """The buffers a state dict holds (whole on every rank), by their unwrapped names."""
        return [
            (_clean(f'{prefix}.{name}' if prefix else name), buf)
            for prefix, module in self.model.named_modules()
            for name, buf in module.named_buffers(recurse=False)
            if name not in module._non_persistent_buffers_set
        ]

    def model_state_dict(self) -> dict:
        if not self.plain_shards:
            return super().model_state_dict()
        state = {name: p.detach().clone() for name, (p, *_) in self._pieces().items()}
        state.update((n, b.detach().clone()) for n, b in self._buffers())
        return state

    def optim_state_dict(self) -> dict:
        # the optimizer holds this rank's pieces (use_orig_params): its own state is sharded
        return self.optim_wrapper.state_dict() if self.plain_shards else super().optim_state_dict()

    def load_optim_state_dict(self, state_dict: dict) -> None:
        if not self.plain_shards:
            return super().load_optim_state_dict(state_dict)
        if not self._loaded_shards:
            raise CheckpointError(
                'cannot resume a sharded run from an ordinary checkpoint: its optimizer state '
                'is not sharded; resume from the sharded checkpoint folder (NAME.pth/), or load '
                'the weights only (load_from without resume)'
            )
        self.optim_wrapper.load_state_dict(state_dict)

    def save_checkpoint(self, filename: str, *, extra_ckpt: Optional[dict] = None, **kwargs):
        if self.plain_shards:
            extra_ckpt = dict(extra_ckpt or {})
            extra_ckpt['meta'] = dict(extra_ckpt.get('meta') or {})
            extra_ckpt['meta'][SHARD_META] = dict(
                world_size=get_world_size(),
                rank=get_rank(),
                params={n: [shape, a, b] for n, (_, shape, a, b) in self._pieces().items()},
            )
        super().save_checkpoint(filename, extra_ckpt=extra_ckpt, **kwargs)

    def load_checkpoint(
        self,
        filename: str,
        *,
        map_location='cpu',
        strict: bool = False,
        revise_keys: list = [(r'^module.', '')],
        callback: Optional[Callable] = None,
    ) -> dict:
        if not self.plain_shards:
            return super().load_checkpoint(
                filename, map_location=map_location, strict=strict, callback=callback
            )
        from mmengine.runner.checkpoint import _load_checkpoint

        self._loaded_shards = osp.isdir(filename)
        path = rank_file(filename, get_rank()) if self._loaded_shards else filename
        self.logger.info(f'Load checkpoint from {path}')
        checkpoint = _load_checkpoint(path, map_location='cpu')
        if callback is not None:
            callback(checkpoint)
        state = checkpoint.pop('state_dict')
        info = (checkpoint.get('meta') or {}).get(SHARD_META)
        if self._loaded_shards and (not info or info['world_size'] != get_world_size()):
            raise CheckpointError(
                f'{filename} was saved by {info["world_size"] if info else "?"} ranks, this run '
                f'has {get_world_size()}: resume with as many ranks, or consolidate it '
                '(tools/consolidate_checkpoint.py) and start from that with load_from'
            )
        self._load_pieces(state, whole=not self._loaded_shards, strict=strict)
        return checkpoint

    @torch.no_grad()
    def _load_pieces(self, state: dict, whole: bool, strict: bool) -> None:
        if whole:  # a DDP checkpoint's names
            state = {
                k[len('module.') :] if k.startswith('module.') else k: v for k, v in state.items()
            }
        else:
            state = dict(state)
        missing = []
        for name, (p, shape, a, b) in self._pieces().items():
            if name not in state:
                missing.append(name)
                continue
            value = state.pop(name)
            if whole and list(value.shape) != shape:
                raise CheckpointError(
                    f'{name} has shape {tuple(value.shape)} in the checkpoint, {tuple(shape)} in '
                    'the model'
                )
            p.copy_((value.reshape(-1)[a:b] if whole else value).view_as(p))
        for name, buf in self._buffers():
            if name in state:
                buf.copy_(state.pop(name))
            else:
                missing.append(name)
        if missing or state:
            msg = (
                f'the checkpoint lacks {len(missing)} tensor(s) of the model '
                f'({", ".join(missing[:5])}) and has {len(state)} the model has not '
                f'({", ".join(list(state)[:5])})'
            )
            if strict:
                raise CheckpointError(msg)
            self.logger.warning(msg)

    _loaded_shards = False
    _model_cfg: Optional[dict] = None


_FULL = (None, torch.float32, torch.float64, 'float32', 'float64', 'float', 'double')


def mixed_precision_for(model: nn.Module, mixed_precision: dict) -> dict:
    """FSDP's ``mixed_precision`` (a config dict) as mmrepa's models can train with it.

    Buffers stay in full precision (``buffer_dtype`` float32 or unset; anything lower is
    refused): FSDP would keep the BatchNorm statistics and the λ schedules rounded to 8
    mantissa bits, and save and fold them so. FSDP's default of a unit of its own for every
    BatchNorm (run in full precision) would split the blocks whose fold absorbs it and hide
    the BatchNorm from the layers that apply it by type; here the BatchNorms stay in their
    block's unit and compute with float32 weights and statistics on the low-precision input
    (:class:`Float32AffineBatchNorm`). The optimizer keeps float32 weights either way.
    """
    mp = dict(mixed_precision)
    if mp.get('buffer_dtype') not in _FULL:
        raise ConfigError(
            f'mixed_precision buffer_dtype={mp["buffer_dtype"]!r} would keep the BatchNorm '
            "statistics and λ rounded; set buffer_dtype='float32' (param_dtype and "
            'reduce_dtype may be bfloat16)'
        )
    mp.setdefault('_module_classes_to_ignore', ())
    if mp.get('param_dtype') in _FULL:
        return mp
    for name, module in model.named_modules():
        if type(module) in _PLAIN_BATCHNORMS:
            # in place (not a new module, as convert_sync_batchnorm makes): its parameters,
            # buffers, hooks and every reference to it stay, and so does its type's name
            module.__class__ = _float32_affine_class(type(module))
        elif isinstance(module, _BatchNorm) and not isinstance(module, Float32AffineBatchNorm):
            raise ConfigError(
                f'{name} is a {type(module).__name__}, which mixed precision under '
                'FoldableFSDPStrategy cannot keep in float32 (plain BatchNorm1d/2d/3d only); '
                'train it in float32 (no mixed_precision) or with sync_bn=None'
            )
    return mp


class Float32AffineBatchNorm:
    """A BatchNorm (mixed in before its class) whose weight and bias FSDP casts to bfloat16 /
    float16 computes with them cast back to its statistics' dtype: torch's kernel takes a
    low-precision input with float32 weights and statistics (and computes in float32), not
    low-precision weights with float32 statistics."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w is None or w.dtype in (torch.float32, torch.float64):
            return super().forward(x)
        # _BatchNorm.forward, branch for branch, with the weights cast (it reads self.weight,
        # which FSDP sets to the low-precision view during the forward pass)
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative average
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        kept = not self.training or self.track_running_stats  # else the buffers stay as they are
        full = torch.float32 if self.running_mean is None else self.running_mean.dtype
        return F.batch_norm(
            x,
            self.running_mean if kept else None,
            self.running_var if kept else None,
            w.to(full),
            self.bias.to(full),
            batch_stats,
            factor,
            self.eps,
        )


_PLAIN_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_FLOAT32_AFFINE: Dict[type, type] = {}


def _float32_affine_class(cls: type) -> type:
    if cls not in _FLOAT32_AFFINE:
        _FLOAT32_AFFINE[cls] = type(cls.__name__, (Float32AffineBatchNorm, cls), {})
    return _FLOAT32_AFFINE[cls]


def _piece_ranges(model: nn.Module) -> Dict[nn.Parameter, Tuple[List[int], int, int]]:
    """``{parameter: (full shape, start, end)}``: with ``use_orig_params`` each original
    parameter is a view of entries ``[start, end)`` of its flattened whole on this rank
    (FSDP's ``_shard_param_infos``, private: no public API says where a rank's piece lies)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    where = {}
    for unit in model.modules():
        handle = getattr(unit, '_handle', None) if isinstance(unit, FSDP) else None
        if handle is None:
            continue
        flat = handle.flat_param
        if getattr(flat, '_params', None) is None:
            raise ConfigError(
                'FoldableFSDPStrategy needs model_wrapper=dict(use_orig_params=True) '
                "(mmengine's default) for state_dict_cfg='sharded' and the RepOpt optimizers; "
                "set it back (or use state_dict_cfg='full' and another optimizer)"
            )
        for p, shape, info in zip(flat._params, flat._shapes, flat._shard_param_infos):
            start, end = (
                (info.intra_param_start_idx, info.intra_param_end_idx + 1)
                if info.in_shard
                else (0, 0)
            )
            where[p] = (list(shape), start, end)
    return where


def _attach_pieces(optimizer, model: nn.Module) -> None:
    """Give a RepOpt optimizer the branch scales of this rank's pieces of its kernels, now
    and whenever it rebuilds them, and make its CSLA gradient norm sum over the ranks.

    This is the one place that knows where the pieces lie (FSDP's internals), so that the
    optimizers stay unaware of sharding: they multiply entry by entry, and the slice of a
    whole kernel's scales (:func:`scales_of_piece`) makes a piece's update exactly the
    unsharded update, sliced. The scales are built from the gathered model (the layers give
    them for whole kernels); they depend on buffers, which ``load_from`` or a resume may
    change after the optimizer is built: the first step rebuilds them (a second gather).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    from .optimizers import collect_branch_scales, scales_of_piece

    # never attached (mmengine rebuilt a built optimizer, or another constructor made it): the
    # {} below would mean "plain on purpose" and it would train without multipliers
    if optimizer._repopt is None:
        raise ConfigError(
            f'{type(optimizer).__name__} under FoldableFSDPStrategy has no RepOpt kernel '
            'attached; give optim_wrapper as a config dict with constructor='
            "'RepOptOptimWrapperConstructor'"
        )
    kept = set(optimizer.repopt_params)  # what the constructor checked and attached
    where = _piece_ranges(model)
    names = {p: _clean(n) for n, p in model.named_parameters()}

    def pieces():
        with FSDP.summon_full_params(model, writeback=False):
            whole = collect_branch_scales(model)
        return {
            p: scales_of_piece(a, where[p][1], where[p][2], p.shape)
            for p, a in whole.items()
            if p in kept
        }

    optimizer.attach_branch_scales(pieces(), names, source=pieces)
    if model.sharding_strategy != ShardingStrategy.NO_SHARD:  # NO_SHARD: whole on every rank
        optimizer.set_shard_group(model.process_group)


def _check_sharded_optimizer(optim_wrapper) -> None:
    """Refuse what needs whole tensors on one rank: with ``use_orig_params`` every rank's
    optimizer sees its pieces of the parameters only, so a per-tensor norm is a piece's."""
    optimizer = optim_wrapper.optimizer
    name = type(optimizer).__name__
    if name.lower() in ('lamb', 'lars'):
        raise ConfigError(
            f'{name} under FoldableFSDPStrategy: its per-tensor trust ratio would be computed on '
            "each rank's piece of a tensor; use AdamW, or DDP (the default Runner)"
        )
    if getattr(optim_wrapper, 'grad_name', None) == 'grad_norm':
        raise ConfigError(
            'optim_wrapper.clip_grad by norm under FoldableFSDPStrategy: OptimWrapper would '
            "clip by each rank's norm of its pieces and the ranks would diverge; remove "
            "clip_grad or clip by value (clip_grad=dict(type='value', clip_value=...))"
        )


def _clean(name: str) -> str:
    """A parameter's name in the unwrapped model."""
    return name.replace('_fsdp_wrapped_module.', '').replace('_checkpoint_wrapped_module.', '')
