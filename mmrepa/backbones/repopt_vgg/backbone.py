"""RepOpt-VGG (RepOptimizers): a plain VGG-style network of 3x3 conv-BN-ReLU layers, trained
with gradient multipliers instead of training-time branches (Ding et al., Re-parameterizing
Your Optimizers rather than Architectures).

``mode`` picks the layer form: ``'target'`` (the plain layers a RepOptimizer trains, with the
Hyper-Search constants as buffers), ``'hs'`` (Hyper-Search: learns the constants), ``'csla'``
(the block the target emulates, constants fixed: the reference of the tests) and ``'repvgg'``
(the RepVGG baseline). Every mode folds into the same inference network.
"""

import logging
import os.path as osp
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.registry import MODELS

from ...checkpoint.loading import read_state_dict, strip_prefixes
from ...errors import CheckpointError, ConfigError
from ...layers.grad_checkpoint import checkpoint_forward
from ..base import DenseBackbone, lookup_arch
from .blocks import CSLAConvBN, RepOptConvBN, RepVGGConvBN, hyper_search_init

# depths of stages 1-4, their widths, the stem's width (the RepOptimizers paper's Table 1)
ARCH_SETTINGS = {
    'B1': dict(depths=(4, 6, 16, 1), widths=(128, 256, 512, 2048), stem_width=64),
    'B2': dict(depths=(4, 6, 16, 1), widths=(160, 320, 640, 2560), stem_width=64),
    'L1': dict(depths=(8, 14, 24, 1), widths=(128, 256, 512, 2048), stem_width=64),
    'L2': dict(depths=(8, 14, 24, 1), widths=(160, 320, 640, 2560), stem_width=64),
}
MODES = {'target': RepOptConvBN, 'hs': CSLAConvBN, 'csla': CSLAConvBN, 'repvgg': RepVGGConvBN}
SCALE_NAMES = ('scale_conv', 'scale_1x1', 'scale_identity')


def resolve_arch(arch: Union[str, dict]) -> dict:
    """``'B1' | 'B2' | 'L1' | 'L2'`` or ``dict(depths=(4 ints), widths=(4 ints), stem_width=)``."""
    arch = lookup_arch(arch, ARCH_SETTINGS, ('depths', 'widths', 'stem_width'))
    if len(arch['depths']) != 4 or len(arch['widths']) != 4:
        raise ConfigError(f'arch dict needs depths and widths of 4 stages, got {arch}')
    return arch


@MODELS.register_module()
class RepOptVGG(DenseBackbone):
    """RepOpt-VGG backbone: a stem and four stages of 3x3 conv-BN-ReLU layers, the stem and
    each stage's first layer with stride 2 (outputs at strides 4, 8, 16, 32), no pooling.

    State-dict names are the official ones (``stage0.*``, ``stage{1..4}.{j}.*``), so released
    RepOpt-VGG, Hyper-Search and RepVGG checkpoints and the released scale files load.

    Args:
        arch (str | dict): ``'B1'``, ``'B2'``, ``'L1'``, ``'L2'`` or ``dict(depths=(4 ints),
            widths=(4 ints), stem_width=int)`` (small ones for tests; no accuracy promised).
        mode (str): ``'target'`` (default; train with ``RepOptSGD``), ``'hs'`` (Hyper-Search),
            ``'csla'`` (constants fixed; the reference the target reproduces) or ``'repvgg'``.
        scales (str | dict, optional): The Hyper-Search constants of ``'target'`` / ``'csla'``:
            a file in the official layout (``stage0.scale_conv.weight``, ...), a whole
            Hyper-Search checkpoint, or such a dict. Every layer's constants must be there, by
            name; anything else is an error naming the key. Without it the constants are the
            initial values of the Hyper-Search model (:func:`hyper_search_init`): s = t = 1 on
            the stem and on each stage's first layer, sqrt(2 / l) on the l-th layer with an
            identity branch of a stage, i = 1. Training from scratch with them is the paper's
            "same as HS initialization" ablation: 77.71 % ImageNet top-1 for B1, against
            77.59 % with all constants 1 and 78.47 % with the searched ones, so give
            ``scales`` for real runs. A checkpoint of a target model trained by mmrepa
            carries its constants; loading one without them (the official target
            checkpoints) with ``init_cfg`` needs ``scales`` (an error names the file), and
            training a kernel that ``load_from`` brought without them is refused at the first
            step. Ignored (not read) with ``deploy=True``: the folded network has no
            constants.
        identity_init (str): Rule of initialization, identity term: ``'searched'`` (default,
            as the released models) or ``'one'`` (the paper's Eq. 4).
        kernel_init (str): Random part of the rule: ``'torch'`` (default; Conv2d's default,
            as the released models) or ``'msra'``.
        strides (Sequence[int]): Strides of the stem and the first layer of stages 1-4.
            Default: (2, 2, 2, 2, 2).
        in_channels (int): Input channels. Default: 3.
        out_indices (Sequence[int]): Stages (0-3) whose outputs are returned. Default: (0, 1,
            2, 3).
        out_norm_cfg (dict, optional): Norm of each output; none by default (a CNN; the
            ImageNet checkpoints have none).
        frozen_stages (int): Freeze the stem (0) and stages 1..n. Default: -1.
        norm_eval (bool): Keep BatchNorms in eval mode while training. Default: False.
        with_cp (bool): Gradient checkpointing per layer. Default: False.
        deploy (bool): Build the folded network (3x3 convs with bias); ``scales`` is then
            ignored. Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...)`` loads weights;
            without it, ``'target'`` applies the rule of initialization (from scratch only).
        se (bool): A squeeze-and-excitation block after every layer's ReLU, the stem's
            included (:class:`~mmrepa.backbones.repopt_vgg.blocks.PostSE`, width C // 4), in
            every mode: RepOpt-VGG-L2‡ of the paper's Table 3. Its weights get no multiplier
            and the fold keeps it as it is. The scales need no SE (the released code's
            Hyper-Search model has none; L2‡ takes L2's). Default: False.

    Shapes: (B, in_channels, H, W) -> a tuple of (B, widths[i], H / 2^(i+2), W / 2^(i+2)).
    """

    stem_name = 'stage0'

    def __init__(
        self,
        arch: Union[str, dict] = 'B1',
        mode: str = 'target',
        scales: Union[None, str, Dict[str, torch.Tensor]] = None,
        identity_init: str = 'searched',
        kernel_init: str = 'torch',
        strides: Sequence[int] = (2, 2, 2, 2, 2),
        in_channels: int = 3,
        out_indices: Sequence[int] = (0, 1, 2, 3),
        out_norm_cfg: Optional[dict] = None,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
        se: bool = False,
    ):
        super().__init__(init_cfg=init_cfg)
        _check_choices(mode, identity_init, kernel_init, strides)
        self.arch = resolve_arch(arch)
        self.mode, self.identity_init, self.kernel_init = mode, identity_init, kernel_init
        self.se = se
        self.in_channels, self.with_cp = in_channels, with_cp
        self.num_features = list(self.arch['widths'])
        self._check_options(4, out_indices, frozen_stages, norm_eval, deploy)

        def layer(c_in, c_out, stride, depth):
            # depth: how many layers with an identity branch the stage has up to this one
            kwargs = dict(deploy=deploy, se=se)
            if mode in ('hs', 'csla', 'target'):
                kwargs.update(init_scale=hyper_search_init(depth))
            if mode in ('hs', 'csla'):
                kwargs.update(trainable_scales=mode == 'hs')
            return MODES[mode](c_in, c_out, stride, **kwargs)

        self.stage0 = layer(in_channels, self.arch['stem_width'], strides[0], 0)
        c_in = self.arch['stem_width']
        for i, (num_layers, width) in enumerate(zip(self.arch['depths'], self.arch['widths'])):
            self.add_module(f'stage{i + 1}', _stage(layer, c_in, width, num_layers, strides[i + 1]))
            c_in = width
        if scales is not None:
            if mode not in ('target', 'csla'):
                raise ConfigError(
                    f"scales= is for mode 'target' or 'csla' (constants); mode "
                    f'{mode!r} {"learns them" if mode == "hs" else "has none"}'
                )
            if deploy:
                print_log(
                    'RepOptVGG(deploy=True): scales= ignored, not read: the folded '
                    'network has no branch constants (they only shape training)',
                    logger='current',
                    level=logging.INFO,
                )
                scales = None
            else:
                self.load_scales(scales)
        self.scales_source = (
            None if scales is None else (scales if isinstance(scales, str) else 'a dict')
        )
        self._setup_outputs(out_norm_cfg)

    @property
    def stages(self) -> List[nn.Sequential]:
        return [getattr(self, f'stage{i}') for i in range(1, 5)]

    def layers(self) -> Dict[str, nn.Module]:
        """``{official name: layer}`` of the stem and every stage's layers."""
        out = {'stage0': self.stage0}
        for i, stage in enumerate(self.stages):
            out.update({f'stage{i + 1}.{j}': m for j, m in enumerate(stage)})
        return out

    def forward(self, x: torch.Tensor):
        self._check_input(x, 1, 'empty input')  # padding 1: any size works
        x = self._layer(self.stage0, x)
        outs = []
        for i, stage in enumerate(self.stages):
            for m in stage:
                x = self._layer(m, x)
            if i in self.out_indices:
                outs.append(getattr(self, f'norm{i}')(x))
        return tuple(outs)

    def _layer(self, module, x):
        return checkpoint_forward(module, module, x) if self.with_cp else module(x)

    # -- the Hyper-Search constants

    def load_scales(self, scales: Union[str, Dict[str, torch.Tensor]]) -> None:
        """Set every layer's constants from ``scales`` (see the class docstring), strictly by
        name: a layer whose constants are missing, a constant this network has no layer for or
        one of another shape is a :class:`~mmrepa.errors.CheckpointError` naming the key."""
        source = scales if isinstance(scales, str) else 'the scales dict'
        if isinstance(scales, str):
            if not osp.isfile(scales):
                raise FileNotFoundError(
                    f'scales file {scales} does not exist (model.backbone.scales: a '
                    'Hyper-Search scales file in the official layout, or an HS checkpoint; '
                    'scales=None to load a trained checkpoint, which carries its constants)'
                )
            scales = read_state_dict(scales)
        found = {
            k: v
            for k, v in strip_prefixes(scales).items()
            if k.split('.')[-2] in SCALE_NAMES and k.endswith('.weight')
        }
        if not found:
            raise CheckpointError(
                f'{source} holds no Hyper-Search scales (keys such as stage0.scale_conv.weight)'
            )
        expected = {}
        for name, m in self.layers().items():
            for key in SCALE_NAMES[: 3 if m.has_identity else 2]:
                expected[f'{name}.{key}.weight'] = m.out_channels
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        if missing or extra:
            raise CheckpointError(
                f'{source} does not fit this RepOpt-VGG ({self._arch_name()}): '
                + (
                    f'no scales for {missing[:4]}{" ..." if len(missing) > 4 else ""} '
                    if missing
                    else ''
                )
                + (
                    f'scales for layers it lacks: {extra[:4]}{" ..." if len(extra) > 4 else ""}'
                    if extra
                    else ''
                )
                + '. Is it the scales file of another arch?'
            )
        for key, channels in expected.items():
            if tuple(found[key].shape) != (channels,):
                raise CheckpointError(
                    f'{source}: {key} has shape {tuple(found[key].shape)}, '
                    f'this layer has {channels} channels: another arch?'
                )
        with torch.no_grad():
            for name, m in self.layers().items():
                s, t = found[f'{name}.scale_conv.weight'], found[f'{name}.scale_1x1.weight']
                i = found.get(f'{name}.scale_identity.weight')
                if isinstance(m, RepOptConvBN):
                    m.set_scales(s, t, i)
                else:
                    m.scale_conv.weight.copy_(s)
                    m.scale_1x1.weight.copy_(t)
                    if i is not None:
                        m.scale_identity.weight.copy_(i)

    def export_scales(self) -> Dict[str, torch.Tensor]:
        """The constants in the official layout (of a Hyper-Search / CSLA model)."""
        if self.mode not in ('hs', 'csla'):
            raise ValueError(f"export_scales() needs mode 'hs' or 'csla', not {self.mode!r}")
        return {
            f'{name}.{k}': v for name, m in self.layers().items() for k, v in m.scales().items()
        }

    def _arch_name(self) -> str:
        for name, arch in ARCH_SETTINGS.items():
            if arch == self.arch:
                return name
        return str(self.arch)

    # -- initialization and loading

    def init_weights(self):
        """Pretrained weights if ``init_cfg`` says so; else, for ``'target'``, the rule of
        initialization (from scratch: refused on a model whose BatchNorms have seen data)."""
        if isinstance(self.init_cfg, dict) and self.init_cfg.get('type') == 'Pretrained':
            return super().init_weights()
        super().init_weights()
        if self.mode == 'target' and not self.deploy:
            self.reinitialize()

    def reinitialize(self, generator: Optional[torch.Generator] = None) -> None:
        """Apply the rule of initialization to every layer (the paper's §3.4, Eq. 4)."""
        used = [name for name, m in self.layers().items() if int(m.bn.num_batches_tracked) > 0]
        if used:
            raise RuntimeError(
                f'RepOptVGG: the rule of initialization is for training from scratch, but '
                f'{used[0]} ({len(used)} layers) has trained BatchNorm statistics: these '
                'weights were loaded or trained. Load them with init_cfg=Pretrained / '
                'load_from instead of re-initializing.'
            )
        if self.scales_source is None:
            print_log(
                'RepOptVGG: no scales= given, so the constants are the Hyper-Search '
                'initial values (s = t = sqrt(2 / depth)): the paper\'s "same as HS '
                'initialization" ablation (B1: 77.71 % top-1 against 78.47 % with the '
                'searched constants)',
                logger='current',
                level=logging.WARNING,
            )
        for m in self.layers().values():
            m.reinitialize_(self.kernel_init, self.identity_init, generator)

    def filter_checkpoint(self, state_dict):
        """Official / mmrepa / mmpretrain / mmdet layouts (``backbone.`` and ``module.``
        prefixes dropped; the classifier ``linear.*`` left in, reported as unused). A
        Hyper-Search checkpoint is refused for a target model: it is a scales file."""
        state_dict = strip_prefixes(state_dict)
        hs = any('.conv_1x1.' in k or k.endswith('scale_conv.weight') for k in state_dict)
        if self.mode == 'target' and hs:
            raise CheckpointError(
                'this is a Hyper-Search checkpoint (it has conv_1x1 / scale_*.weight keys): its '
                "kernels are not the target's. Give it as RepOptVGG(scales=PATH), not as "
                'pretrained weights.'
            )
        return state_dict

    def optional_keys(self, state_dict, source):
        """Official target checkpoints carry no constants: then ``scales=`` must have given
        them (a :class:`~mmrepa.errors.CheckpointError` naming the file otherwise), as the
        kernels were trained with them. A checkpoint that carries them must agree with
        ``scales=``, if given."""
        if self.mode != 'target' or self.deploy:
            return []
        own = {k: v for k, v in self.state_dict().items() if k.split('.')[-1] in SCALE_NAMES}
        missing = [k for k in own if k not in state_dict]
        if missing and self.scales_source is None:
            raise CheckpointError(
                f'{source} has no RepOpt constants ({missing[0]} and {len(missing) - 1} more) '
                'and RepOptVGG got no scales=: set model.backbone.scales to the Hyper-Search '
                'scales file these kernels were trained with (e.g. '
                'checkpoints/RepOpt-VGG-B1-scales.pth for B1)'
            )
        differ = [
            k
            for k, v in own.items()
            if k in state_dict
            and state_dict[k].shape == v.shape
            and not torch.allclose(state_dict[k].to(v), v, rtol=1e-3, atol=1e-6)
        ]
        if differ:
            raise CheckpointError(
                f'{source} carries RepOpt constants that differ from scales='
                f'{self.scales_source} (first: {differ[0]}): drop scales= to train with the '
                "checkpoint's own, or give the scales file it was trained with"
            )
        return [f'*.{name}' for name in SCALE_NAMES]


def _check_choices(mode, identity_init, kernel_init, strides) -> None:
    if mode not in MODES:
        raise ConfigError(f'mode must be one of {sorted(MODES)}, got {mode!r}')
    if identity_init not in ('searched', 'one'):
        raise ConfigError(f"identity_init must be 'searched' or 'one', got {identity_init!r}")
    if kernel_init not in ('torch', 'msra'):
        raise ConfigError(f"kernel_init must be 'torch' or 'msra', got {kernel_init!r}")
    if len(strides) != 5 or set(strides) - {1, 2}:
        raise ConfigError(f'strides: 5 values of 1 or 2 (stem, stages 1-4), got {strides}')


def _stage(layer, c_in: int, width: int, num_layers: int, stride: int) -> nn.Sequential:
    """One stage: its first layer strides; ``layer``'s depth counts the layers with an
    identity branch up to each one (the Hyper-Search initial scales depend on it)."""
    layers, depth = [], 0
    for j in range(num_layers):
        s = stride if j == 0 else 1
        with_identity = c_in == width and s == 1
        depth += with_identity
        layers.append(layer(c_in, width, s, depth if with_identity else 0))
        c_in = width
    return nn.Sequential(*layers)
