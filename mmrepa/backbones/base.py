"""What every mmrepa backbone shares: the dense-prediction options users know from mmdet."""

import re
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import constant_init, trunc_normal_init
from torch.nn.modules.batchnorm import _BatchNorm

from ..checkpoint.loading import LoadReport, check_shapes, load_state_dict_checked, read_state_dict
from ..errors import ConfigError, InputError
from ..fold import FoldPolicy, Reparameterizable, is_affine_norm
from ..layers import PRepBN
from ..registry import build_norm_layer


def lookup_arch(
    arch: Union[str, dict],
    settings: Dict[str, dict],
    required: Sequence[str],
    aliases: Optional[Dict[str, str]] = None,
) -> dict:
    """A copy of the named arch of ``settings`` (any case, or one of ``aliases``), or of an
    arch dict that has the ``required`` keys; the error names both forms."""
    if isinstance(arch, str):
        by_lower = {name.lower(): name for name in settings}
        name = arch.lower()
        name = by_lower.get((aliases or {}).get(name, name))
        if name is None:
            raise ConfigError(
                f'unknown arch {arch!r}; choose one of {sorted(settings)} or give '
                f'dict({", ".join(f"{k}=..." for k in required)})'
            )
        return dict(settings[name])
    if not isinstance(arch, dict) or not set(required) <= set(arch):
        raise ConfigError(f'a custom arch must be a dict with keys {sorted(required)}, got {arch}')
    return dict(arch)


def drop_path_rates(drop_path_rate: float, num_blocks: int) -> List[float]:
    """Stochastic depth rising linearly from 0 to ``drop_path_rate`` over the blocks: the values
    of timm's ``calculate_drop_path_rates`` (a float32 linspace on the CPU, whatever the
    default device), without importing timm (seconds) when a model is built."""
    return torch.linspace(0, drop_path_rate, num_blocks, device='cpu').tolist()


class DenseBackbone(Reparameterizable, BaseModule):
    """Base of the backbones: ``out_indices`` with one output norm each, ``frozen_stages``,
    ``norm_eval``, ``deploy``, pretrained loading and the fold protocol.

    Subclasses build ``self.stages`` (a ``ModuleList``) and the module named by
    :attr:`stem_name`, call :meth:`_setup_outputs` once both exist, and implement
    :meth:`filter_checkpoint` (checkpoint layouts -> own names) and :meth:`_default_init`.
    """

    stem_name = 'stem'  # frozen with frozen_stages >= 0
    pretrained_options = ('use_ema',)  # init_cfg keys passed on to load_pretrained

    def _check_options(
        self,
        num_stages: int,
        out_indices: Sequence[int],
        frozen_stages: int,
        norm_eval: bool,
        deploy: bool,
    ) -> None:
        """Validate the shared options (errors name the allowed range) and store them."""
        self.num_stages = num_stages
        self.out_indices = tuple(out_indices)
        for i in self.out_indices:
            if not 0 <= i < num_stages:
                raise ConfigError(
                    f'out_indices {self.out_indices}: each index must be in [0, {num_stages - 1}]'
                )
        if not -1 <= frozen_stages <= num_stages:
            raise ConfigError(f'frozen_stages must be in [-1, {num_stages}], got {frozen_stages}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.deploy = deploy

    def _setup_outputs(self, out_norm_cfg: Optional[dict]) -> None:
        """Add ``norm{i}`` for every output stage (an identity if ``out_norm_cfg`` is None:
        a classifier that normalises after pooling), then apply ``frozen_stages``."""
        for i in self.out_indices:
            norm = (
                nn.Identity()
                if out_norm_cfg is None
                else build_norm_layer(out_norm_cfg, self.num_features[i])[1]
            )
            self.add_module(f'norm{i}', norm)
        self._freeze_stages()

    def has_output_norm(self, i: int) -> bool:
        """Whether stage ``i``'s output has a norm with weights (a checkpoint's classifier
        norm can go there)."""
        return any(True for _ in getattr(self, f'norm{i}', nn.Identity()).parameters())

    def _check_input(self, x: torch.Tensor, min_size: int, why: str) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise InputError(
                f'{type(self).__name__} expects input (B, {self.in_channels}, H, W), '
                f'got {tuple(x.shape)}'
            )
        if min(x.shape[2:]) < min_size:
            raise InputError(f'input {tuple(x.shape[2:])} is too small: {why}')

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # on every load path (load_from, resume, tools/test.py), not only init_cfg's
        check_shapes(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply_fold(self, tensors: dict, policy: FoldPolicy) -> None:
        """The parts are folded (by :class:`~mmrepa.fold.Reparameterizable`); frozen stages
        stay frozen: the folded layers are new parameters, which would otherwise train."""
        self._freeze_stages()

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def _freeze_stages(self):
        if self.frozen_stages >= 0:
            stem = getattr(self, self.stem_name)
            stem.eval()
            for p in stem.parameters():
                p.requires_grad = False
        for i in range(self.frozen_stages):
            modules = [self.stages[i]]
            if i in self.out_indices:
                modules.append(getattr(self, f'norm{i}'))
            for m in modules:
                m.eval()
                for p in m.parameters():
                    p.requires_grad = False

    def init_weights(self):
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            options = {k: self.init_cfg[k] for k in self.pretrained_options if k in self.init_cfg}
            self.load_pretrained(self.init_cfg['checkpoint'], **options)
            self._is_init = True
            return
        super().init_weights()
        if self.init_cfg is None:
            self._default_init()

    def _default_init(self) -> None:
        """The family's own initialisation, used without ``init_cfg``."""

    def filter_checkpoint(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """A checkpoint's state dict in this backbone's names (the family's converter)."""
        raise NotImplementedError

    def load_pretrained(self, filename: str, use_ema: bool = False) -> LoadReport:
        """Load any layout :meth:`filter_checkpoint` understands (``use_ema``: the
        checkpoint's EMA weights, e.g. ``init_cfg=dict(type='Pretrained', checkpoint=...,
        use_ema=True)``). Only the output norms (classification checkpoints have one final
        norm) and :meth:`optional_keys` may be missing; other missing keys, and tensors of
        another shape, are errors. Returns what was loaded, left missing and not used."""
        source = str(filename)
        state_dict = self.filter_checkpoint(read_state_dict(filename, use_ema=use_ema))
        return load_state_dict_checked(
            self,
            state_dict,
            source=source,
            may_be_missing=['norm[0-9]*', *self.optional_keys(state_dict, source)],
            explain=self.attention_mismatch,
        )

    def attention_mismatch(self, missing: List[str], unexpected: List[str]) -> Optional[str]:
        """With per-stage ``attn_types``: where the missing keys and the unused ones are the
        blocks' attention in the same stages, the checkpoint has another attention kind there
        (a softmax PRepBN-PVT checkpoint for SLAB-PVT): say so, and which of its parts differ."""
        if not getattr(self, 'attn_types', None):
            return None
        needed, found = _attention_keys(missing), _attention_keys(unexpected)
        stages = sorted(set(needed) & set(found))
        if not stages:
            return None
        i = stages[0]
        found[i], needed[i] = _distinct_parts(found[i], needed[i])
        return (
            f'its blocks have another attention than this {type(self).__name__} '
            f"(attn_types='{self.attn_types}') in stage(s) {', '.join(map(str, stages))}: "
            f"stage {i}'s has {', '.join(sorted(found[i]))} where the model's has "
            f'{", ".join(sorted(needed[i]))}; set attn_types to the attention the checkpoint '
            'was trained with'
        )

    def optional_keys(self, state_dict: Dict[str, torch.Tensor], source: str) -> List[str]:
        """Patterns of own keys that this (filtered) checkpoint may lack."""
        return []


_ATTENTION_KEY = re.compile(r'^stages\.(\d+)\.blocks\.\d+\.attn\.(.+)$')


def _attention_keys(keys: List[str]) -> Dict[int, List[str]]:
    """``{stage: [keys below a block's attn.]}`` of the blocks' attention keys in ``keys``."""
    out = {}
    for key in keys:
        m = _ATTENTION_KEY.match(key)
        if m:
            out.setdefault(int(m[1]), []).append(m[2])
    return out


def _distinct_parts(a: List[str], b: List[str]) -> tuple:
    """The names of the parts two attentions' keys name, below the path they all share (Swin's
    ``w_msa.``): ``(sorted names of a, sorted names of b)``."""
    split = [k.split('.') for k in a + b]
    depth = 0
    while all(len(k) > depth + 1 and k[depth] == split[0][depth] for k in split):
        depth += 1
    return tuple(sorted({k.split('.')[depth] for k in keys}) for keys in (a, b))


def trunc_normal_init_(model: nn.Module, types=(nn.Linear,)) -> None:
    """timm / Swin initialisation: truncated-normal weights (std .02) and zero biases for
    ``types``, identity LayerNorms and BatchNorms."""
    for m in model.modules():
        if isinstance(m, types):
            trunc_normal_init(m, std=0.02, bias=0.0)
        elif isinstance(m, (nn.LayerNorm, _BatchNorm)):
            constant_init(m, 1.0, bias=0.0)


class PRepBNBackbone:
    """Mixin of the backbones whose norms are :class:`~mmrepa.layers.PRepBN` (SLAB): the norm
    config check, and loading LayerNorm checkpoints into the LN branches."""

    @staticmethod
    def _check_prepbn_cfg(prepbn_cfg: dict) -> None:
        if not is_affine_norm(build_norm_layer(prepbn_cfg, 4)[1]):
            raise ConfigError(
                f'prepbn_cfg must build a norm that is affine at inference '
                f'(PRepBN, RepBN), got {prepbn_cfg}'
            )

    def _prepbn_options(self, prepbn_cfg: dict, kwargs: dict, parent: str) -> dict:
        """``kwargs`` for the RePa ``parent`` with every norm ``prepbn_cfg``: ``norm_cfg``, and
        ``ffn_norm='LN'`` (the FFN's pre-norm is ``norm_cfg``, no hidden norm). Called before
        the parent's ``__init__``; refuses ``kwargs`` that set either."""
        for key in ('norm_cfg', 'ffn_norm'):
            if key in kwargs:
                raise ConfigError(
                    f'{type(self).__name__} sets {key} itself (every norm inside the network is '
                    f'prepbn_cfg); give prepbn_cfg instead, or use {parent}'
                )
        self._check_prepbn_cfg(prepbn_cfg)
        return dict(kwargs, ffn_norm='LN', norm_cfg=prepbn_cfg)

    def prepbn_layers(self) -> List[PRepBN]:
        """Every PRepBN of the backbone (none once folded)."""
        return [m for m in self.modules() if isinstance(m, PRepBN)]

    def ln_weights_to_prepbn(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Plain LayerNorm weights where this model has a PRepBN go to its LN branch."""
        for name, module in self.named_modules():
            if isinstance(module, PRepBN):
                for leaf in ('weight', 'bias'):
                    if f'{name}.{leaf}' in state_dict:
                        state_dict[f'{name}.ln.{leaf}'] = state_dict.pop(f'{name}.{leaf}')
        return state_dict

    def optional_keys(self, state_dict, source):
        """λ may be missing. A LayerNorm-only checkpoint (the vanilla model) fills the LN
        branches and leaves the RepBN branches fresh (logged): train from λ = 1 before using
        the model in eval mode. A checkpoint that has RepBN branches must have every
        BatchNorm statistic."""
        if self.deploy or any('.repbn.' in k for k in state_dict):
            return ['*.lam']
        name = type(self).__name__
        if self.norm_eval:
            raise ConfigError(
                f'{source} is a LayerNorm checkpoint: the RepBN branches of this {name} '
                'start with BatchNorm statistics 0/1, and norm_eval=True would keep them '
                'there. Train with norm_eval=False (and PRepBNScheduleHook from lambda=1), '
                'or load a PRepBN checkpoint.'
            )
        print_log(
            f'{source} is a LayerNorm checkpoint: its norms went to the LN branches; '
            f'the RepBN branches of {len(self.prepbn_layers())} PRepBN layers start '
            'fresh (BatchNorm statistics 0/1, eta=1). Train from lambda=1 before '
            'evaluating: eval mode uses the RepBN branch only.',
            logger='current',
            level=30,
        )
        return ['*.lam', '*.repbn.*']
