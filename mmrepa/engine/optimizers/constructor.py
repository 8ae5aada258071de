"""RepOptOptimWrapperConstructor: builds a RepOpt optimizer for a model with RepOpt kernels and
refuses every setting that would silently break the equivalence with the CSLA model."""

import copy
import logging
from typing import Dict, List, Optional

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS

from ...errors import ConfigError
from .base import RepOptOptimizer
from .branch_scales import collect_branch_scales, param_names

# what each refused optimizer would need instead, and why it cannot be exact
_REFUSED = {
    'sgd': "use type='RepOptSGD' (same arguments)",
    'adamw': "use type='RepOptAdamW' (same arguments)",
    'lars': 'LARS scales every tensor by its own trust ratio, which differs between the CSLA '
    "branches and the merged kernel; use type='RepOptSGD'",
    'lamb': 'LAMB scales every tensor by its own trust ratio, which differs between the CSLA '
    "branches and the merged kernel; use type='RepOptAdamW'",
}


def _type_name(optim_type) -> str:
    return (
        optim_type
        if isinstance(optim_type, str)
        else getattr(optim_type, '__name__', str(optim_type))
    )


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class RepOptOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Optimizer wrapper constructor for RepOpt models (gradient re-parameterization).

    Builds the parameter groups like ``DefaultOptimWrapperConstructor`` (``paramwise_cfg``
    works as usual), collects the branch scales of every module with
    ``repopt_branch_scales()``, checks that training stays equivalent to the imaginary CSLA
    model and attaches the scales to the optimizer. The scales are not saved in the optimizer
    state: they are rebuilt from the model whenever the optimizer is built (resume is exact).

    Example::

        optim_wrapper = dict(
            constructor='RepOptOptimWrapperConstructor',
            optimizer=dict(type='RepOptSGD', lr=0.1, momentum=0.9, nesterov=True,
                           weight_decay=1e-4),
            paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0.),
            clip_grad=dict(type='csla', max_norm=10.))  # or no clip_grad

    Refused, each with a ``ConfigError`` naming the option or parameter:

    - a model without RepOpt kernels;
    - an optimizer other than ``RepOptSGD`` / ``RepOptAdamW`` (or subclasses). Plain ``SGD`` /
      ``AdamW`` are *not* converted silently: the message names the RepOpt type to use; to
      train a RepOpt model without multipliers on purpose, use the default constructor.
      ``Adam`` with ``weight_decay`` (coupled L2 inside Adam) has no element-wise equivalent,
      LARS / LAMB use per-tensor trust ratios;
    - ``clip_grad`` other than ``dict(type='csla', max_norm=...)``: clipping by the plain
      gradient norm (or by value) breaks the equivalence; ``type='csla'`` clips by the CSLA
      model's norm ``sqrt(sum M*g**2 + sum g**2)`` inside the optimizer step, which is exact
      and works with ``OptimWrapper`` and ``AmpOptimWrapper`` (after unscaling) alike;
    - strict checks (``paramwise_cfg=dict(repopt_strict=False)`` turns them into warnings):
      a RepOpt kernel whose ``lr`` or ``weight_decay`` differs from the optimizer's (a
      ``custom_keys`` entry or another paramwise rule matched it). One kernel holds all
      branches of a layer, so such a setting is the same for all of them and still describes
      *a* CSLA, but one whose identity scale and 1x1 branch are trained
      differently from the one the scales were searched for. Non-strict
      mode is for deliberate cases such as a backbone ``lr_mult`` when fine-tuning. Frozen
      kernels (``frozen_stages``) are fine: they never move, as frozen CSLA layers would not.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        self.strict = bool(paramwise_cfg.pop('repopt_strict', True))
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    # --- checks -------------------------------------------------------------------------------

    def _check_optimizer_type(self) -> type:
        optim_type = self.optimizer_cfg.get('type')
        cls = optim_type
        if isinstance(optim_type, str):
            with OPTIMIZERS.switch_scope_and_registry(None) as registry:
                cls = registry.get(optim_type)
            if cls is None:
                raise ConfigError(
                    f'optimizer type {optim_type!r} is not registered; use '
                    "type='RepOptSGD' or type='RepOptAdamW'"
                )
        if isinstance(cls, type) and issubclass(cls, RepOptOptimizer):
            return cls
        name = _type_name(optim_type)
        key = name.split('.')[-1].lower()  # 'mmengine.SGD' -> 'sgd'
        if key == 'adam':
            why = (
                "Adam's coupled L2 decay has no element-wise equivalent for the CSLA "
                "branches; use type='RepOptAdamW' (decoupled decay; weight_decay=0 gives "
                'plain Adam)'
            )
        elif any(k in key for k in ('lars', 'lamb')):
            why = _REFUSED['lars' if 'lars' in key else 'lamb']
        else:
            why = _REFUSED.get(key, "supported: type='RepOptSGD' or type='RepOptAdamW'")
        raise ConfigError(
            f'optimizer type {name!r} cannot train RepOpt kernels with their gradient '
            f'multipliers under RepOptOptimWrapperConstructor: {why}. To train the model '
            "without multipliers on purpose, drop constructor='RepOptOptimWrapperConstructor'"
        )

    @staticmethod
    def _csla_clip(optim_wrapper_cfg: dict) -> Optional[dict]:
        """Pop ``clip_grad`` from the wrapper config; the CSLA settings or None."""
        clip = optim_wrapper_cfg.pop('clip_grad', None)
        if clip is None:
            return None
        clip = copy.deepcopy(dict(clip))
        given = dict(clip)
        if clip.pop('type', None) != 'csla':
            raise ConfigError(
                f'optim_wrapper.clip_grad={given!r} clips by the plain gradient norm (or value), '
                'which breaks the equivalence between RepOpt training and the CSLA model '
                "(docs/backbones/repopt_vgg.md, Optimizers); use clip_grad=dict(type='csla', "
                'max_norm=...) to clip by '
                "the CSLA model's gradient norm, or remove clip_grad"
            )
        unknown = set(clip) - {'max_norm', 'norm_type', 'error_if_nonfinite'}
        if unknown or 'max_norm' not in clip:
            raise ConfigError(
                f"clip_grad=dict(type='csla', ...) takes max_norm (required), "
                f'norm_type=2 and error_if_nonfinite; got {sorted(clip)}'
            )
        return clip

    def _custom_key(self, name: str) -> Optional[str]:
        """The ``custom_keys`` entry DefaultOptimWrapperConstructor applies to ``name``."""
        custom_keys = self.paramwise_cfg.get('custom_keys', {})
        for key in sorted(sorted(custom_keys), key=len, reverse=True):
            if key in name:
                return key
        return None

    def _refuse_or_warn(self, msg: str) -> None:
        if self.strict:
            raise ConfigError(
                msg + '; if this is intended, set paramwise_cfg=dict(repopt_strict=False)'
            )
        print_log(msg + ' (allowed: repopt_strict=False)', logger='current', level=logging.WARNING)

    def _check_groups(self, optimizer: RepOptOptimizer, scales: Dict, names: Dict) -> Dict:
        """Strict checks on the kernels' groups; returns the scales of the kernels to attach."""
        base_lr = optimizer.defaults.get('lr')
        base_wd = optimizer.defaults.get('weight_decay')
        group_of = {p: g for g in optimizer.param_groups for p in g['params']}
        kept = {}
        for p, a in scales.items():
            name = names[p]
            if not p.requires_grad:  # frozen_stages: never moves, as the frozen CSLA layer
                if p in group_of:
                    kept[p] = a  # should it be unfrozen later, it trains with its multiplier
                continue
            group = group_of.get(p)
            if group is None:
                raise ConfigError(
                    f'RepOpt kernel {name!r} is trainable but in no parameter '
                    'group of the optimizer (check paramwise_cfg, e.g. '
                    'bypass_duplicate)'
                )
            key = self._custom_key(name)
            why = (
                f'paramwise_cfg.custom_keys[{key!r}]' if key is not None else 'a paramwise_cfg rule'
            )
            for option, base, mult in (
                ('weight_decay', base_wd, 'decay_mult'),
                ('lr', base_lr, 'lr_mult'),
            ):
                value = group.get(option, base)
                if base is not None and value != base:
                    self._refuse_or_warn(
                        f'RepOpt kernel {name!r} gets {option}={value} from {why} instead of '
                        f"the optimizer's {option}={base}: a {mult} on a RepOpt kernel "
                        'applies to every branch of the emulated CSLA layer, its identity '
                        'scale included'
                    )
            kept[p] = a
        return kept

    # --- build --------------------------------------------------------------------------------

    def __call__(self, model: nn.Module) -> OptimWrapper:
        if hasattr(model, 'module'):
            model = model.module
        optimizer_cls = self._check_optimizer_type()
        optim_wrapper_cfg = copy.deepcopy(self.optim_wrapper_cfg)
        optim_wrapper_cfg.setdefault('type', 'OptimWrapper')
        clip = self._csla_clip(optim_wrapper_cfg)

        names = param_names(model)
        scales = collect_branch_scales(model)
        if not scales:
            raise ConfigError(
                f'RepOpt optimizer on a model without multipliers: no module of '
                f'{type(model).__name__} has repopt_branch_scales() (e.g. a RepOptVGG in '
                "mode='target'); use a plain optimizer without "
                "constructor='RepOptOptimWrapperConstructor'"
            )

        optimizer_cfg = self.optimizer_cfg.copy()
        optimizer_cfg['type'] = optimizer_cls
        if self.paramwise_cfg:
            params: List = []
            self.add_params(params, model)
        else:
            params = list(model.parameters())
        optimizer_cfg['params'] = params
        optimizer = OPTIMIZERS.build(optimizer_cfg)

        kept = self._check_groups(optimizer, scales, names)
        optimizer.attach_branch_scales(
            kept,
            names,
            source=lambda: {p: a for p, a in collect_branch_scales(model).items() if p in kept},
        )
        if clip is not None:
            try:
                optimizer.set_csla_clip(**clip)
            except ValueError as e:
                raise ConfigError(f'optim_wrapper.clip_grad: {e}') from None
        return OPTIM_WRAPPERS.build(optim_wrapper_cfg, default_args=dict(optimizer=optimizer))
