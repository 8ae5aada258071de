"""The sizes of the published MetaFormers and the settings their blocks share."""

from typing import Dict, Union

from ...errors import ConfigError
from ..base import lookup_arch

# depths and dims of the published variants (the paper's Table II; timm's metaformer.py).
ARCH_SETTINGS: Dict[str, dict] = {
    's18': dict(depths=(3, 3, 9, 3), dims=(64, 128, 320, 512)),
    's36': dict(depths=(3, 12, 18, 3), dims=(64, 128, 320, 512)),
    'm36': dict(depths=(3, 12, 18, 3), dims=(96, 192, 384, 576)),
    'b36': dict(depths=(3, 12, 18, 3), dims=(128, 256, 512, 768)),
}
# PoolFormer (v1, v2), IdentityFormer and RandFormer: the PoolFormer paper's sizes (the
# MetaFormer baselines paper's Table I; timm's poolformer*). m36 / m48 end at 768, not 576.
POOLFORMER_ARCHS: Dict[str, dict] = {
    's12': dict(depths=(2, 2, 6, 2), dims=(64, 128, 320, 512)),
    's24': dict(depths=(4, 4, 12, 4), dims=(64, 128, 320, 512)),
    's36': dict(depths=(6, 6, 18, 6), dims=(64, 128, 320, 512)),
    'm36': dict(depths=(6, 6, 18, 6), dims=(96, 192, 384, 768)),
    'm48': dict(depths=(8, 8, 24, 8), dims=(96, 192, 384, 768)),
}
# PoolFormer v1's LayerScale initial values (timm's poolformer_*, mmpretrain's arch table)
POOLFORMER_LAYER_SCALE = {'s12': 1e-5, 's24': 1e-5, 's36': 1e-6, 'm36': 1e-6, 'm48': 1e-6}
NUM_STAGES = 4
MLP_RATIO = 4
# LayerNorm without bias, as in the blocks, the stem and the downsampling layers.
LN_NO_BIAS = dict(type='LN', eps=1e-6, bias=False)
# GroupNorm with one group (channels-last), without bias: PoolFormerV2's, Identity/RandFormer's
GN1_NO_BIAS = dict(type='GN1', eps=1e-6, bias=False)


def resolve_arch(arch: Union[str, dict], settings: Dict[str, dict] = ARCH_SETTINGS) -> dict:
    """A name of ``settings`` or ``dict(depths=..., dims=...)`` -> arch settings."""
    arch = lookup_arch(arch, settings, ('depths', 'dims'))
    if (
        set(arch) != {'depths', 'dims'}
        or len(arch['depths']) != NUM_STAGES
        or len(arch['dims']) != NUM_STAGES
    ):
        raise ConfigError(
            f'a custom arch needs {NUM_STAGES} depths and {NUM_STAGES} dims (one '
            f'per stage) and no other key, got {arch}'
        )
    return dict(depths=tuple(arch['depths']), dims=tuple(arch['dims']))
