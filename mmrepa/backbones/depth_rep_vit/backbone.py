"""DepthRepViT: a ViT trained as L/n blocks of n joined branches that fold into an L/n-layer ViT
(depth re-parameterization, SPEC-depth §7).

With ``num_branches=1`` the network is a plain pre-norm ViT (timm / mmpretrain
``VisionTransformer`` / MAE-Lite) and loads their checkpoints; with n > 1 a 12-layer ViT's
checkpoint can initialise the branches (layer k·n + b -> block k, branch b).
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.model import ModuleList
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.runner.checkpoint import CheckpointLoader

from ...checkpoint.loading import LoadReport, strip_prefixes
from ...errors import CheckpointError, ConfigError
from ...layers import FoldablePatchEmbed, checkpoint_forward
from ...options import is_int_at_least
from ..base import DenseBackbone, drop_path_rates, lookup_arch
from .join import JoinedBlock, stack_attention_branches, stack_ffn_branches

# Width, depth L of the original (sequential) ViT, heads. 'tiny' is the paper's (MAE-Lite's)
# ViT-Tiny with 12 heads of 16 channels, not timm's / DeiT's 3 heads of 64 (SPEC §7.1): the
# shapes are identical, so the head count is checked when loading a checkpoint.
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=192, num_layers=12, num_heads=12),
    'small': dict(embed_dims=384, num_layers=12, num_heads=6),
    'base': dict(embed_dims=768, num_layers=12, num_heads=12),
}
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base'}
OUT_TYPES = ('avg', 'cls', 'featmap')


def resolve_arch(arch: Union[str, dict]) -> dict:
    """``'tiny' | 'small' | 'base'`` (or t/s/b) or a dict with ``embed_dims``, ``num_layers``
    (the original depth L) and ``num_heads`` (per branch)."""
    return lookup_arch(arch, ARCH_SETTINGS, ('embed_dims', 'num_layers', 'num_heads'), ARCH_ALIASES)


def resolve_branches(num_layers: int, num_branches: Optional[int], depth: Optional[int]) -> int:
    """n from ``num_branches`` or the deployed ``depth`` (L / n); checks that n divides L."""
    if num_branches is None and depth is None:
        raise ConfigError(
            'DepthRepViT needs num_branches (n) or depth (the deployed depth '
            f'L / n; the arch has L = {num_layers} layers)'
        )
    if depth is not None:
        if not is_int_at_least(depth, 1) or num_layers % depth:
            divisors = [k for k in range(1, num_layers + 1) if num_layers % k == 0]
            raise ConfigError(
                f"depth={depth!r} does not divide the arch's {num_layers} layers "
                f'into equal groups of branches; choose one of {divisors}'
            )
        n = num_layers // depth
        if num_branches is not None and num_branches != n:
            raise ConfigError(
                f'num_branches={num_branches} contradicts depth={depth} '
                f'({num_layers} layers / {depth} = {n} branches); give only one'
            )
        return n
    if not is_int_at_least(num_branches, 1) or num_layers % num_branches:
        divisors = [k for k in range(1, num_layers + 1) if num_layers % k == 0]
        raise ConfigError(
            f"num_branches={num_branches!r} does not divide the arch's "
            f'{num_layers} layers; choose one of {divisors}'
        )
    return num_branches


def resize_pos_embed(
    pos_embed: torch.Tensor,
    src_shape: Tuple[int, int],
    dst_shape: Tuple[int, int],
    mode: str = 'bicubic',
    num_extra_tokens: int = 0,
) -> torch.Tensor:
    """(1, extra + Hs·Ws, C) -> (1, extra + Hd·Wd, C): the patch grid resized with
    ``F.interpolate`` (``align_corners=False``, as mmpretrain and timm), extra tokens kept.

    Not mmpretrain's ``resize_pos_embed`` nor timm's ``resample_abs_pos_embed``: both resize in
    float32, which would cut a float64 model's forward (the fold checks) to float32."""
    if tuple(src_shape) == tuple(dst_shape):
        return pos_embed
    extra, grid = pos_embed[:, :num_extra_tokens], pos_embed[:, num_extra_tokens:]
    C = pos_embed.shape[-1]
    grid = grid.reshape(1, *src_shape, C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(dst_shape), mode=mode, align_corners=False)
    return torch.cat([extra, grid.flatten(2).transpose(1, 2)], dim=1)


@MODELS.register_module()
class DepthRepViT(DenseBackbone):
    """ViT whose L layers train as L / n blocks of n joined branches and fold into L / n.

    Each block (:class:`~mmrepa.backbones.depth_rep_vit.JoinedBlock`) holds n attention and n
    FFN branches behind shared LayerNorms, joined at the softmax and GELU inputs by λ, which
    :class:`~mmrepa.engine.BranchJoinScheduleHook` ramps from 0 to 1.
    :meth:`reparameterize` (λ = 1 exactly, or a :class:`~mmrepa.fold.FoldError` naming the
    block) gives L / n plain ViT blocks: standard ones for ``join='qkv'``, heads of width
    n·d_h for ``join='logits'``.

    Outputs, per ``out_type``, for every block in ``out_indices``, each through its own
    output norm ``norm{i}``:

    - ``'avg'``: (B, d), the mean of the patch tokens (class token excluded), then the norm
      (the paper's ``fc_norm``; mmpretrain's ``out_type='avg_featmap'``).
    - ``'cls'``: (B, d), the normalized class token (mmpretrain's ``'cls_token'`` with
      ``final_norm``).
    - ``'featmap'``: (B, d, ⌈H/16⌉, ⌈W/16⌉) maps of the patch tokens for dense prediction
      (ViTDet: feed them to :class:`~mmrepa.necks.SimpleFPN`).

    Args:
        arch (str | dict): ``'tiny'`` (192 wide, 12 heads: the paper's), ``'small'``,
            ``'base'``, or ``dict(embed_dims, num_layers, num_heads)``; ``num_layers`` is the
            original depth L. Default: ``'tiny'``.
        num_branches (int, optional): n; must divide L. Default: None (give ``depth``).
        depth (int, optional): The deployed depth L / n, instead of ``num_branches``.
        join (str): ``'logits'`` (the paper's network) or ``'qkv'`` (mmrepa's extension,
            folds to a standard ViT; not the paper's, accuracy unmeasured). Default:
            ``'logits'``.
        img_size (int | tuple): Pretraining size; sizes the position embedding, which is
            interpolated for other inputs. Default: 224.
        patch_size (int): Default: 16.
        in_channels (int): Default: 3.
        mlp_ratio (float): Default: 4.
        qkv_bias (bool): Default: True.
        drop_rate (float): Dropout after the position embedding. Default: 0.
        drop_path_rate (float): Stochastic depth, rising linearly over the L / n blocks
            (on each summed sub-layer output). Default: 0.
        with_cls_token (bool): Default: True.
        out_type (str): ``'avg'``, ``'cls'`` or ``'featmap'``. Default: ``'avg'``.
        out_indices (Sequence[int] | int): Blocks whose outputs are returned (negative counts
            from the end). Default: -1.
        window_size (int, optional): Windowed attention (padding masked) in every block not in
            ``global_blocks``; needs ``with_cls_token=False``. None: all global. Default: None.
        global_blocks (Sequence[int]): Blocks with global attention when ``window_size`` is
            set (ViTDet: every third). Default: ().
        interpolate_mode (str): Position-embedding resizing. Default: ``'bicubic'``.
        norm_cfg (dict): Block norms. Default: ``dict(type='LN', eps=1e-6)``.
        out_norm_cfg (dict, optional): Output norms (None: none). Default: as ``norm_cfg``.
        join_lambda (float): Initial λ. Default: 0.
        diversity_loss_weight (float): α of the diversity loss (SPEC §7.3; the paper's 0.05);
            > 0 needs a model that collects it
            (:class:`~mmrepa.classifiers.DiversityImageClassifier`)
            and global attention. Default: 0.
        frozen_stages (int): Freeze the patch and position embeddings and the class token (0)
            and blocks 1..k (k >= 1). Default: -1.
        norm_eval (bool): Unused (no BatchNorm); accepted for mmdet configs. Default: False.
        with_cp (bool): Gradient checkpointing per block. Default: False.
        deploy (bool): Build the folded blocks (load folded checkpoints). Default: False.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH, num_heads=H)``
            loads mmrepa, mmpretrain ``VisionTransformer``, timm and MAE-Lite ViT checkpoints
            (see :meth:`filter_checkpoint`). The checkpoint's head count is read from its
            mmengine config; ``num_heads`` states it for checkpoints without one.
    """

    stem_name = 'patch_embed'
    pretrained_options = ('use_ema', 'num_heads')

    def __init__(
        self,
        arch: Union[str, dict] = 'tiny',
        num_branches: Optional[int] = None,
        depth: Optional[int] = None,
        join: str = 'logits',
        img_size: Union[int, Tuple[int, int]] = 224,
        patch_size: int = 16,
        in_channels: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        with_cls_token: bool = True,
        out_type: str = 'avg',
        out_indices: Union[int, Sequence[int]] = -1,
        window_size: Optional[int] = None,
        global_blocks: Sequence[int] = (),
        interpolate_mode: str = 'bicubic',
        norm_cfg: dict = dict(type='LN', eps=1e-6),
        out_norm_cfg: Optional[dict] = dict(type='LN', eps=1e-6),
        join_lambda: float = 0.0,
        diversity_loss_weight: float = 0.0,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        with_cp: bool = False,
        deploy: bool = False,
        init_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        arch = resolve_arch(arch)
        self.embed_dims, self.num_heads = arch['embed_dims'], arch['num_heads']
        self.num_layers = arch['num_layers']
        self.num_branches = resolve_branches(self.num_layers, num_branches, depth)
        self.depth = self.num_layers // self.num_branches
        if out_type not in OUT_TYPES:
            raise ConfigError(f'out_type must be one of {OUT_TYPES}, got {out_type!r}')
        if out_type == 'cls' and not with_cls_token:
            raise ConfigError("out_type='cls' needs with_cls_token=True")
        if window_size is not None and with_cls_token:
            raise ConfigError(
                'windowed attention (window_size) works on the patch grid only: '
                'set with_cls_token=False (ViTDet drops the class token)'
            )
        out_indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        out_indices = [i + self.depth if i < 0 else i for i in out_indices]
        self._check_options(self.depth, out_indices, frozen_stages, norm_eval, deploy)
        global_blocks = sorted({i + self.depth if i < 0 else i for i in global_blocks})
        if any(not 0 <= i < self.depth for i in global_blocks):
            raise ConfigError(
                f'global_blocks {global_blocks}: each index must be in '
                f'[0, {self.depth - 1}] (the deployed depth is {self.depth})'
            )
        if diversity_loss_weight < 0:
            raise ConfigError(f'diversity_loss_weight must be >= 0, got {diversity_loss_weight}')
        if diversity_loss_weight > 0 and window_size is not None:
            raise ConfigError(
                'the diversity loss is a classification regularizer (SPEC §7.3); '
                'set diversity_loss_weight=0 with windowed attention'
            )
        self.in_channels, self.patch_size = in_channels, patch_size
        self.out_type, self.with_cls_token = out_type, with_cls_token
        self.num_extra_tokens = int(with_cls_token)
        self.interpolate_mode = interpolate_mode
        self.with_cp = with_cp
        self.join, self.qkv_bias = join, qkv_bias
        self.diversity_loss_weight = float(diversity_loss_weight)
        self._pending_diversity = None
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.patch_resolution = (img_size[0] // patch_size, img_size[1] // patch_size)
        self.num_features = [self.embed_dims] * self.depth

        self.patch_embed = FoldablePatchEmbed(
            in_channels=in_channels,
            embed_dims=self.embed_dims,
            conv_type='Conv2d',
            kernel_size=patch_size,
            stride=patch_size,
            norm_cfg=None,
        )
        self.cls_token = (
            nn.Parameter(torch.zeros(1, 1, self.embed_dims)) if with_cls_token else None
        )
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]
        self.pos_embed = nn.Parameter(
            torch.zeros(1, self.num_extra_tokens + num_patches, self.embed_dims)
        )
        self.drop_after_pos = nn.Dropout(p=drop_rate)
        dpr = drop_path_rates(drop_path_rate, self.depth)
        self.stages = ModuleList(
            [
                JoinedBlock(
                    self.embed_dims,
                    self.num_heads,
                    self.num_branches,
                    join,
                    mlp_ratio,
                    qkv_bias,
                    dpr[i],
                    norm_cfg,
                    window_size=None if i in global_blocks else window_size,
                    join_lambda=join_lambda,
                    deploy=deploy,
                )
                for i in range(self.depth)
            ]
        )
        if self.diversity_loss_weight > 0:
            for module in self.modules():
                if hasattr(module, 'track_branch_diversity'):
                    module.track_branch_diversity = True
        self._setup_outputs(out_norm_cfg)

    # -- forward

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x (B, in_channels, H, W) -> one output per ``out_indices`` (see ``out_type``)."""
        self._check_input(x, self.patch_size, f'smaller than the patch size {self.patch_size}')
        B = x.shape[0]
        x, hw_shape = self.patch_embed(x)
        hw_shape = (int(hw_shape[0]), int(hw_shape[1]))  # plain ints, also when tracing
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        x = x + resize_pos_embed(
            self.pos_embed,
            self.patch_resolution,
            hw_shape,
            self.interpolate_mode,
            self.num_extra_tokens,
        )
        x = self.drop_after_pos(x)
        outs = []
        for i, block in enumerate(self.stages):
            if self.with_cp:
                x = checkpoint_forward(block, block, x, hw_shape)
            else:
                x = block(x, hw_shape)
            if i in self.out_indices:
                outs.append(self._format_output(i, x, hw_shape))
        if self.diversity_loss_weight > 0 and self.training:
            self._collect_diversity()
        return tuple(outs)

    def _format_output(self, i: int, x: torch.Tensor, hw_shape) -> torch.Tensor:
        norm = getattr(self, f'norm{i}')
        if self.out_type == 'cls':
            return norm(x[:, 0])
        patches = x[:, self.num_extra_tokens :]
        if self.out_type == 'avg':
            return norm(patches.mean(dim=1))
        return norm(patches).reshape(x.shape[0], *hw_shape, -1).permute(0, 3, 1, 2).contiguous()

    # -- diversity loss

    def _collect_diversity(self) -> None:
        if self._pending_diversity is not None:
            raise ConfigError(
                'DepthRepViT(diversity_loss_weight > 0) computed a diversity loss that nothing '
                "collected: use model=dict(type='DiversityImageClassifier', ...) (mmpretrain) "
                'or set diversity_loss_weight=0'
            )
        terms = []
        for m in self.modules():
            if getattr(m, 'branch_diversity', None) is not None:
                terms.append(m.branch_diversity)
                m.branch_diversity = None
        if terms:
            self._pending_diversity = self.diversity_loss_weight * torch.stack(terms).mean()

    def pop_diversity_loss(self) -> Optional[torch.Tensor]:
        """α · the mean diversity term over all joined sub-layers of the last training forward
        (None if there was none: one branch, eval mode or the weight is 0); clears it."""
        loss, self._pending_diversity = self._pending_diversity, None
        return loss

    # -- options

    def _freeze_stages(self):
        super()._freeze_stages()
        if self.frozen_stages >= 0:
            for p in (self.cls_token, self.pos_embed):
                if p is not None:
                    p.requires_grad = False

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """(depth, number of depths) for mmpretrain's layer-wise learning-rate decay: 0 for
        the embeddings, k + 1 for block k (all its branches: they are one deployed layer),
        the last for the output norms and whatever follows the backbone (the head)."""
        num_layers = self.depth + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix) :]
        if name in ('cls_token', 'pos_embed') or name.startswith('patch_embed'):
            return 0, num_layers
        if name.startswith('stages.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    def _default_init(self) -> None:
        """ViT's initialisation (timm / DeiT): truncated normal (std .02) for the position
        embedding, class token and every Linear, each branch drawn as its own Linear."""
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)
        for block in self.stages:
            for layer in (block.attn, block.mlp):
                if layer.deploy:
                    for m in layer.modules():
                        if isinstance(m, nn.Linear):
                            trunc_normal_(m.weight, std=0.02)
                            nn.init.zeros_(m.bias)
                else:
                    layer.reset_branch_parameters('trunc_normal', std=0.02)

    # -- checkpoints

    def load_pretrained(
        self, filename: str, use_ema: bool = False, num_heads: Optional[int] = None
    ) -> LoadReport:
        """As :meth:`DenseBackbone.load_pretrained`, after checking the checkpoint's head count
        (``num_heads``, else its mmengine config): 3- and 12-head ViT-Tiny checkpoints have
        the same shapes and would load silently into the wrong function (SPEC §7.8)."""
        found = num_heads if num_heads is not None else checkpoint_num_heads(filename)
        if found is None:
            raise CheckpointError(
                f'{filename} does not say how many attention heads it was trained with (no '
                f'mmengine config inside), and a {self.num_heads}-head model cannot tell from '
                'the shapes (ViT-Tiny has 3 heads in timm/DeiT, 12 in MAE-Lite and the paper). '
                "State it: init_cfg=dict(type='Pretrained', checkpoint=..., num_heads=H)"
            )
        if found != self.num_heads:
            raise CheckpointError(
                f'{filename} has {found} attention heads per layer, this DepthRepViT '
                f'{self.num_heads}: the weights would load but compute another function. Set '
                f'arch=dict(embed_dims={self.embed_dims}, num_layers={self.num_layers}, '
                f'num_heads={found}) or use a {self.num_heads}-head checkpoint'
            )
        return super().load_pretrained(filename, use_ema=use_ema)

    def optional_keys(self, state_dict, source) -> List[str]:
        # λ is the run's (the schedule sets it); ViT checkpoints have none
        return ['stages.*.join_lambda']

    def filter_checkpoint(self, state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Any ViT layout in DepthRepViT names; see :func:`checkpoint_filter_fn`."""
        return checkpoint_filter_fn(state_dict, self)


# ----------------------------------------------------------------------------- checkpoints

# Per-layer tensors in timm names (= the folded block's), from mmpretrain's.
_MMPRETRAIN_NAMES = (
    ('ln1.', 'norm1.'),
    ('ln2.', 'norm2.'),
    ('ffn.layers.0.0.', 'mlp.fc1.'),
    ('ffn.layers.1.', 'mlp.fc2.'),
)
_BRANCH_KEYS = (
    'attn.qkv.weight',
    'attn.qkv.bias',
    'attn.proj.weight',
    'attn.proj.bias',
    'mlp.fc1.weight',
    'mlp.fc1.bias',
    'mlp.fc2.weight',
    'mlp.fc2.bias',
)


def _split_layers(state_dict: Dict[str, torch.Tensor]):
    """A timm (``blocks.i``) or mmpretrain (``layers.i``) ViT -> ({i: {timm name: tensor}},
    the other keys in timm names)."""
    layers, rest = {}, {}
    for key, value in state_dict.items():
        head, _, tail = key.partition('.')
        if head in ('blocks', 'layers') and tail.split('.')[0].isdigit():
            index, _, name = tail.partition('.')
            if head == 'layers':
                for old, new in _MMPRETRAIN_NAMES:
                    if name.startswith(old):
                        name = new + name[len(old) :]
            layers.setdefault(int(index), {})[name] = value
        else:
            rest[key.replace('patch_embed.proj.', 'patch_embed.projection.')] = value
    return layers, rest


def _final_norm_source(model: DepthRepViT, rest: Dict[str, torch.Tensor]) -> Optional[str]:
    """The checkpoint norm that plays the role of the last output norm: the pooled-feature
    norm for ``'avg'`` (timm ``fc_norm``, mmpretrain ``ln2``), the final norm for ``'cls'``
    (timm ``norm``, mmpretrain ``ln1``). Feature maps get none (the dense head adds them)."""
    if model.out_type == 'featmap' or not model.has_output_norm(model.out_indices[-1]):
        return None
    names = ('fc_norm', 'ln2') if model.out_type == 'avg' else ('norm', 'ln1')
    return next((n for n in names if f'{n}.weight' in rest), None)


def checkpoint_filter_fn(
    state_dict: Dict[str, torch.Tensor], model: DepthRepViT
) -> Dict[str, torch.Tensor]:
    """Convert a ViT state dict to :class:`DepthRepViT` names.

    Understands mmrepa's own layout (folded or not, passed through); mmpretrain
    ``VisionTransformer`` (``layers.i.ln1``, ``ffn.layers.0.0``, ...), also inside a
    classifier, detector or segmentor; timm and MAE-Lite ViTs (``blocks.i``). A checkpoint
    of L layers initialises a model of L / n blocks: layer k·n + b -> block k, branch b (the
    block's shared LayerNorms are layer k·n's; the other layers' are reported unused). A
    folded (``deploy=True``) model takes layer k as block k. The position embedding loses
    the class token's entry if the model has none and is resized to the model's grid. Heads
    are reported unused.
    """
    state_dict = strip_prefixes(state_dict)
    if any(k.startswith('stages.') for k in state_dict):
        out = dict(state_dict)
    else:
        layers, rest = _split_layers(state_dict)
        out = {
            k: v
            for k, v in rest.items()
            if k.startswith(('patch_embed.', 'pos_embed', 'cls_token'))
        }
        norm = _final_norm_source(model, rest)
        if norm is not None:
            last = f'norm{model.out_indices[-1]}'
            out.update(
                {f'{last}.weight': rest[f'{norm}.weight'], f'{last}.bias': rest[f'{norm}.bias']}
            )
        out.update(_layers_to_blocks(layers, model))
    pos = out.get('pos_embed')
    if pos is not None:
        out['pos_embed'] = _fit_pos_embed(pos, model)
    return out


def _layers_to_blocks(
    layers: Dict[int, Dict[str, torch.Tensor]], model: DepthRepViT
) -> Dict[str, torch.Tensor]:
    if not layers:
        return {}
    n = 1 if model.deploy else model.num_branches
    if len(layers) != model.depth * n or sorted(layers) != list(range(len(layers))):
        form = 'folded ' if model.deploy else ''
        raise CheckpointError(
            f'the checkpoint has {len(layers)} transformer layers; this {form}DepthRepViT '
            f'needs {model.depth * n} ({model.depth} blocks x {n} branch(es)). A checkpoint '
            f'of L layers initialises L / n blocks of n branches: set num_branches or depth'
        )
    out = {}
    for k in range(model.depth):
        group = [layers[k * n + b] for b in range(n)]
        prefix = f'stages.{k}.'
        for name in ('norm1.weight', 'norm1.bias', 'norm2.weight', 'norm2.bias'):
            if name in group[0]:
                out[prefix + name] = group[0][name]
        if model.deploy:
            out.update(
                {prefix + k2: v for k2, v in group[0].items() if k2.startswith(('attn.', 'mlp.'))}
            )
            continue
        needed = [name for name in _BRANCH_KEYS if model.qkv_bias or name != 'attn.qkv.bias']
        missing = [name for name in needed if any(name not in layer for layer in group)]
        if missing:
            raise CheckpointError(
                f'layer(s) {k * n}..{k * n + n - 1} of the checkpoint lack {sorted(set(missing))}'
            )
        attn = stack_attention_branches(
            [
                {k2[len('attn.') :]: v for k2, v in layer.items() if k2.startswith('attn.')}
                for layer in group
            ],
            model.num_heads,
        )
        ffn = stack_ffn_branches(
            [
                {k2[len('mlp.') :]: v for k2, v in layer.items() if k2.startswith('mlp.')}
                for layer in group
            ]
        )
        out.update({f'{prefix}attn.{k2}': v for k2, v in attn.items()})
        out.update({f'{prefix}mlp.{k2}': v for k2, v in ffn.items()})
    return out


def _fit_pos_embed(pos: torch.Tensor, model: DepthRepViT) -> torch.Tensor:
    """Drop a class-token entry the model does not have; resize the grid to the model's."""
    tokens = pos.shape[1]
    extra = 0 if math.isqrt(tokens) ** 2 == tokens else 1
    side = math.isqrt(tokens - extra)
    if side * side != tokens - extra:
        return pos  # not a square grid: reported as a shape mismatch by the loader
    if extra and not model.with_cls_token:
        pos, extra = pos[:, 1:], 0
    if extra != model.num_extra_tokens:
        return pos  # a class token the checkpoint lacks: reported by the loader
    work = pos if pos.dtype == torch.float64 else pos.float()  # bicubic needs fp32 or fp64
    resized = resize_pos_embed(
        work, (side, side), model.patch_resolution, model.interpolate_mode, extra
    )
    return resized.to(pos.dtype)


def checkpoint_num_heads(filename: str) -> Optional[int]:
    """Heads per layer of the ViT backbone in a checkpoint's mmengine config (``meta.cfg``,
    as mmengine's Runner saves it): mmrepa ``DepthRepViT`` or mmpretrain
    ``VisionTransformer``. None if the checkpoint has no config or another backbone."""
    ckpt = CheckpointLoader.load_checkpoint(filename, map_location='cpu')
    text = ckpt.get('meta', {}).get('cfg') if isinstance(ckpt, dict) else None
    if not isinstance(text, str):
        return None
    try:
        cfg = Config.fromstring(text, '.py')
    except Exception:  # a config that no longer parses here says nothing about heads
        return None
    backbone = cfg.get('model', {}).get('backbone')
    if not isinstance(backbone, dict):
        return None
    kind = str(backbone.get('type', '')).split('.')[-1]
    arch = backbone.get('arch', 'tiny' if kind == 'DepthRepViT' else 'base')
    if isinstance(arch, dict):
        return arch.get('num_heads')
    if kind == 'DepthRepViT':
        return resolve_arch(arch)['num_heads']
    if kind == 'VisionTransformer':
        from mmpretrain.models import VisionTransformer

        settings = VisionTransformer.arch_zoo.get(str(arch).lower())
        return None if settings is None else settings['num_heads']
    return None
