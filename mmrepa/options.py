"""Checks of config options that many modules share, with one wording each."""

import warnings
from typing import Any, Optional

from .errors import ConfigError


def is_int_at_least(value: Any, minimum: int) -> bool:
    """True for an ``int`` >= ``minimum``; False for a bool (``True`` is an int to Python but
    never a meant count), a float such as 2.0, or anything else."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_int(value: Any, name: str, minimum: int = 1, none_means: Optional[str] = None) -> Any:
    """``value`` if it is an integer >= ``minimum`` (or None, where ``none_means`` says what
    None does); otherwise a :class:`ConfigError` naming ``name``."""
    if value is None and none_means is not None:
        return value
    if not is_int_at_least(value, minimum):
        alternative = '' if none_means is None else f' or None ({none_means})'
        raise ConfigError(f'{name} must be an integer >= {minimum}{alternative}, got {value!r}')
    return value


def check_unit_interval(value: Any, name: str) -> float:
    """``value`` as a float in [0, 1]; otherwise a :class:`ConfigError` naming ``name``."""
    value = float(value)
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ConfigError(f'{name} must be in [0, 1], got {value}')
    return value


def per_stage(value: Any, num_stages: int, name: str) -> list:
    """A scalar for every stage, or a sequence with one value per stage."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_stages:
            raise ConfigError(
                f'{name} has {len(value)} entries but the arch has {num_stages} '
                f'stages; give one value or one per stage'
            )
        return list(value)
    return [value] * num_stages


def head_dim(embed_dims: int, num_heads: int) -> int:
    """The width of one attention head; a :class:`ConfigError` unless the heads split
    ``embed_dims`` evenly."""
    check_int(num_heads, 'num_heads')
    if embed_dims % num_heads:
        raise ConfigError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
    return embed_dims // num_heads


def per_stage_ratios(value: Any, num_stages: int, name: str) -> list:
    """:func:`per_stage` of a ratio: every value a number in [0, 1] (not a bool)."""
    values = per_stage(value, num_stages, name)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ConfigError(
                f'{name} must be in [0, 1] (one value or one per stage), got {value!r}'
            )
    return values


def stage_attn_types(value: Optional[str], num_stages: int, example: str) -> str:
    """``attn_types``: one letter per stage, ``'S'`` softmax attention or ``'L'`` simplified
    linear attention; None is all ``'S'``. ``example`` is a valid value to suggest."""
    if value is None:
        return 'S' * num_stages
    if not isinstance(value, str) or len(value) != num_stages or set(value) - set('SL'):
        raise ConfigError(
            f'attn_types must have one letter per stage ({num_stages}), '
            f"'S' (softmax attention) or 'L' (simplified linear attention), "
            f'e.g. {example!r}; got {value!r}'
        )
    return value


def pretrained_init_cfg(pretrained: Optional[str], init_cfg: Optional[dict]) -> Optional[dict]:
    """mmdet's deprecated ``pretrained=PATH`` as the ``init_cfg`` to use, with mmdet's warning.
    Called from a backbone's translation of mmdet arguments inside its ``__init__``: the warning
    points at the code that built the backbone."""
    if pretrained is None:
        return init_cfg
    if init_cfg is not None:
        raise ConfigError('give the checkpoint either as init_cfg or as pretrained, not both')
    warnings.warn(
        "pretrained is deprecated (as in mmdet): use init_cfg=dict(type='Pretrained', "
        'checkpoint=...)',
        stacklevel=4,
    )
    return dict(type='Pretrained', checkpoint=pretrained)
