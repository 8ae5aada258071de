"""MetaFormer checkpoints (timm, the original releases, mmpretrain's PoolFormer, mmrepa) in
mmrepa's names, and the check that a checkpoint is of the model's family and size."""

import re
from collections import defaultdict
from typing import Dict, Optional

import torch
import torch.nn as nn

from ...checkpoint.loading import strip_prefixes
from ...errors import CheckpointError
from .arch import ARCH_SETTINGS, NUM_STAGES, POOLFORMER_ARCHS

_BLOCK = r'^(stages\.\d+\.blocks\.\d+\.)'
# timm's names for a block's MLP branch -> the ChannelIdleFFN ``mlp`` that holds all of it
_MLP_BRANCH = (
    (re.compile(_BLOCK + r'norm2\.'), r'\1mlp.norm1.'),
    (re.compile(_BLOCK + r'mlp\.norm\.'), r'\1mlp.norm2.'),
    (re.compile(_BLOCK + r'res_scale2\.scale$'), r'\1mlp.res_scale'),
    (re.compile(_BLOCK + r'layer_scale2\.scale$'), r'\1mlp.layer_scale'),
    # mmrepa's folded blocks saved before the branch was one module kept it as ``ffn``
    (re.compile(_BLOCK + r'ffn\.'), r'\1mlp.'),
)
_OUT_NORM = re.compile(r'^norm(\d+)\.')
_RELEASE_PREFIXES = ('downsample_layers.', 'network.', 'patch_embed.')


class _Unshaped:
    """Stands for a model tensor in timm's filter, which reshapes a checkpoint tensor to the
    model's when their element counts agree: this count agrees with none (mmrepa's shapes are
    set after the filter)."""

    def numel(self) -> int:
        return -1


class _TimmModelStandIn:
    """What timm's filter reads of its model: the state dict (see :class:`_Unshaped`)."""

    def state_dict(self) -> Dict[str, _Unshaped]:
        return defaultdict(_Unshaped)


def _from_releases(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The sail-sg/metaformer release (``downsample_layers.*``, ``stages.{i}.{j}.*``) and
    PoolFormer v1's release or mmpretrain's ``PoolFormer`` (``patch_embed.*``, ``network.*``)
    in timm's names, by timm's own filter; other layouts pass unchanged.

    mmpretrain's output norms (``norm{2i}``, block outputs of ``network.{2i}``) are no release
    names: they are set aside from timm's renaming and become ``norm{i}``.
    """
    if not any(k.startswith(_RELEASE_PREFIXES) for k in state_dict):
        return state_dict
    # imported here, on this rarer path, because importing timm takes seconds; timm is an
    # optional extra, so a missing one is a one-line DependencyError naming the install
    from ...integrations.optional import require

    require('timm', tool='loading a MetaFormer release checkpoint')
    from timm.models.metaformer import checkpoint_filter_fn as timm_filter

    out_norms, rest = {}, {}
    for k, v in state_dict.items():
        m = _OUT_NORM.match(k)
        if m is None:
            rest[k] = v
        elif int(m.group(1)) % 2 == 0:
            out_norms[f'norm{int(m.group(1)) // 2}.' + k[m.end() :]] = v
        else:
            out_norms[k] = v
    return {**timm_filter(rest, _TimmModelStandIn()), **out_norms}


def _mlp_branch_name(key: str) -> str:
    for pattern, name in _MLP_BRANCH:
        if pattern.match(key):
            return pattern.sub(name, key)
    return key


_BLOCK_NORM = re.compile(r'^stages\.(\d+)\.blocks\.(\d+)\.norm1\.weight$')
# the parameters that tell the token mixers apart (pooling and identity have none)
_MIXER_KEYS = {'pwconv1.weight': 'conv', 'qkv.weight': 'attn', 'random_matrix': 'random'}
_FAMILIES = {
    ('conv',) * 4: 'ConvFormer',
    ('conv', 'conv', 'attn', 'attn'): 'CAFormer',
    ('none', 'none', 'random', 'random'): 'RandFormer',
}


def _structure(state_dict: Dict[str, torch.Tensor]) -> Optional[dict]:
    """Depths, widths, the mixer of each stage (``'none'``: without parameters) and whether
    the blocks have LayerScale, as read from a state dict in our names; None without blocks."""
    depths, dims = [0] * NUM_STAGES, [0] * NUM_STAGES
    for k, v in state_dict.items():
        m = _BLOCK_NORM.match(k)
        if m and int(m.group(1)) < NUM_STAGES:
            i, j = int(m.group(1)), int(m.group(2))
            depths[i] = max(depths[i], j + 1)
            dims[i] = v.shape[0] if v.dim() == 1 else 0
    if not any(depths):
        return None
    mixers = []
    for i in range(NUM_STAGES):
        prefix = f'stages.{i}.blocks.0.token_mixer.'
        found = [kind for key, kind in _MIXER_KEYS.items() if prefix + key in state_dict]
        mixers.append(found[0] if found else 'none')
    layer_scale = any('.layer_scale1.' in k for k in state_dict)
    return dict(depths=tuple(depths), dims=tuple(dims), mixers=tuple(mixers), ls=layer_scale)


def _describe(structure: dict) -> str:
    family = _FAMILIES.get(structure['mixers'])
    if family is None:
        if structure['mixers'] != ('none',) * 4:
            family = f'MetaFormer with mixers {structure["mixers"]}'
        elif structure['ls']:
            family = 'PoolFormer (v1)'
        else:
            family = 'PoolFormerV2 or IdentityFormer'
    size = dict(depths=structure['depths'], dims=structure['dims'])
    for table in (ARCH_SETTINGS, POOLFORMER_ARCHS):
        names = [name for name, arch in table.items() if arch == size]
        if names:
            return f'{family} {names[0]}'
    return f'{family} with depths {size["depths"]} and dims {size["dims"]}'


def _check_structure(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> None:
    """Refuse, in one line, a checkpoint of another family or size than ``model``'s.

    PoolFormerV2 and IdentityFormer have the same parameters: their checkpoints cannot be
    told apart, and either loads into the other."""
    mixers = tuple('none' if m in ('pool', 'identity') else m for m in model.token_mixers)
    own = dict(
        depths=model.depths,
        dims=tuple(model.num_features),
        mixers=mixers,
        ls=any(b.layer_scale1 is not None for b in model.stages[0].blocks),
    )
    found = _structure(state_dict)
    name = type(model).__name__
    if found is None:
        raise CheckpointError(
            f'the checkpoint has no MetaFormer blocks (stages.<i>.blocks.<j>.norm1.weight '
            f'after conversion): it is not a {name} checkpoint'
        )
    if found != own:
        raise CheckpointError(
            f'the checkpoint is a {_describe(found)}, the model a {_describe(own)} ({name}): '
            f'give the checkpoint of this family and size, or build the matching type and arch'
        )


def checkpoint_filter_fn(
    state_dict: Dict[str, torch.Tensor], model: nn.Module, check_structure: bool = True
) -> dict:
    """Convert a MetaFormer-family state dict to :class:`~mmrepa.backbones.metaformer.MetaFormer`
    names and shapes.

    Understands: timm's ``metaformer.py`` (``convformer_s18.sail_in1k``,
    ``poolformer_s12.sail_in1k``, ``poolformerv2_s12.sail_in1k`` etc.; its 1x1-conv pointwise
    weights become Linear weights); the MetaFormer release (``downsample_layers.*``,
    ``stages.{i}.{j}.*``, ``norm``, ``head``: ConvFormer, CAFormer, PoolFormerV2,
    IdentityFormer, RandFormer) and PoolFormer v1's release, both through timm's own filter;
    mmpretrain's ``PoolFormer`` (``patch_embed``, ``network.*``, ``norm{2i}``); mmrepa's own
    (folded or not, matching ``deploy``; also as saved when the MLP branch was ``norm2``,
    ``mlp``, ``res_scale2`` / ``layer_scale2`` and, folded, ``ffn``), also inside a whole
    detector or classifier (``backbone.*``). A block's MLP branch in timm's names (``norm2``,
    ``mlp.{fc1,act,norm,fc2}``, ``res_scale2``, ``layer_scale2``) becomes its
    :class:`~mmrepa.layers.ChannelIdleFFN` ``mlp`` (``norm1``, ``fc1``, ``act``, ``norm2``,
    ``fc2``, ``res_scale``, ``layer_scale``). The classifier's final norm becomes the last
    output norm; the classifier itself is not loaded (the loader lists it as unused). With
    ``check_structure``, a checkpoint of another family or size is refused
    (:class:`CheckpointError`, one line).
    """
    state_dict = _from_releases(strip_prefixes(state_dict))
    if check_structure:
        _check_structure(state_dict, model)
    last_norm = f'norm{model.num_stages - 1}'
    out = {}
    for k, v in state_dict.items():
        if k.startswith('head.norm.') and model.has_output_norm(model.num_stages - 1):
            k = last_norm + k[len('head.norm') :]
        out[_mlp_branch_name(k)] = v  # the classifier (head.fc.*) is left in, as unused
    own = model.state_dict()
    for k, v in out.items():
        if k in own and v.dim() == 4 and own[k].dim() == 2 and v.shape[2:] == (1, 1):
            out[k] = v.flatten(1)  # timm's 1x1 conv (out, in, 1, 1) -> Linear (out, in)
    return out
