"""DepthRepViT: a ViT trained as L/n blocks of n joined branches that fold into an L/n-layer ViT
(Zhou et al., Rethinking Vision Transformer Depth via Structural Reparameterization, §3).

With ``num_branches=1`` the network is a plain pre-norm ViT (timm / mmpretrain
``VisionTransformer`` / MAE-Lite) and loads their checkpoints; with n > 1 a 12-layer ViT's
checkpoint can initialise the branches (layer k·n + b -> block k, branch b).
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import ModuleList
from mmengine.model.weight_init import trunc_normal_
from mmengine.registry import MODELS
from mmengine.runner.checkpoint import CheckpointLoader

from ...checkpoint.loading import LoadReport, strip_prefixes
from ...errors import CheckpointError, ConfigError
from ...layers import checkpoint_forward
from ...options import is_int_at_least
from ..base import drop_path_rates, lookup_arch
from ..plain_vit import PlainViT, fit_pos_embed, split_vit_layers, vit_embeddings
from .block import JoinedBlock
from .branches import stack_attention_branches, stack_ffn_branches

# Width, depth L of the original (sequential) ViT, heads. 'tiny' is the paper's (MAE-Lite's)
# ViT-Tiny with 12 heads of 16 channels (the paper's §4), not timm's / DeiT's 3 heads of 64:
# the shapes are identical, so the head count is checked when loading a checkpoint.
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=192, num_layers=12, num_heads=12),
    'small': dict(embed_dims=384, num_layers=12, num_heads=6),
    'base': dict(embed_dims=768, num_layers=12, num_heads=12),
}
ARCH_ALIASES = {'t': 'tiny', 's': 'small', 'b': 'base'}


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


def _check_diversity_weight(weight: float, window_size: Optional[int]) -> None:
    if weight < 0:
        raise ConfigError(f'diversity_loss_weight must be >= 0, got {weight}')
    if weight > 0 and window_size is not None:
        raise ConfigError(
            'the diversity loss is a classification regularizer (Table 5 of the paper); '
            'set diversity_loss_weight=0 with windowed attention'
        )


@MODELS.register_module()
class DepthRepViT(PlainViT):
    """ViT whose L layers train as L / n blocks of n joined branches and fold into L / n.

    Each block (:class:`~mmrepa.backbones.depth_rep_vit.JoinedBlock`) holds n attention and n
    FFN branches behind shared LayerNorms, joined at the softmax and GELU inputs by λ, which
    :class:`~mmrepa.engine.BranchJoinScheduleHook` ramps from 0 to 1.
    :meth:`reparameterize` (λ = 1 exactly, or a :class:`~mmrepa.fold.FoldError` naming the
    block) gives L / n plain ViT blocks: standard ones for ``join='qkv'``, heads of width
    n·d_h for ``join='logits'``.

    Outputs per ``out_type`` (``'avg'``: the paper's ``fc_norm``), see
    :class:`~mmrepa.backbones.plain_vit.PlainViT`.

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
        diversity_loss_weight (float): α of the diversity loss (the paper's §4: 0.05);
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
        _check_diversity_weight(diversity_loss_weight, window_size)
        windows = self._setup_vit(
            self.embed_dims,
            self.depth,
            img_size,
            patch_size,
            in_channels,
            with_cls_token,
            out_type,
            out_indices,
            window_size,
            global_blocks,
            interpolate_mode,
            drop_rate,
            frozen_stages,
            norm_eval,
            deploy,
        )
        self.with_cp = with_cp
        self.join, self.qkv_bias = join, qkv_bias
        self.diversity_loss_weight = float(diversity_loss_weight)
        self._pending_diversity = None
        self.stages = self._build_blocks(
            mlp_ratio, drop_path_rate, norm_cfg, windows, join_lambda, deploy
        )
        if self.diversity_loss_weight > 0:
            for module in self.modules():
                if hasattr(module, 'track_branch_diversity'):
                    module.track_branch_diversity = True
        self._setup_outputs(out_norm_cfg)

    def _build_blocks(self, mlp_ratio, drop_path_rate, norm_cfg, windows, join_lambda, deploy):
        """The L / n joined blocks, drop path growing linearly with depth."""
        dpr = drop_path_rates(drop_path_rate, self.depth)
        return ModuleList(
            [
                JoinedBlock(
                    self.embed_dims,
                    self.num_heads,
                    self.num_branches,
                    self.join,
                    mlp_ratio,
                    self.qkv_bias,
                    dpr[i],
                    norm_cfg,
                    window_size=windows[i],
                    join_lambda=join_lambda,
                    deploy=deploy,
                )
                for i in range(self.depth)
            ]
        )

    # -- forward

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """As :meth:`PlainViT.forward`, then collects the diversity loss when training."""
        outs = super().forward(x)
        if self.diversity_loss_weight > 0 and self.training:
            self._collect_diversity()
        return outs

    def _run_block(self, block: nn.Module, x: torch.Tensor, hw_shape) -> torch.Tensor:
        if self.with_cp:
            return checkpoint_forward(block, block, x, hw_shape)
        return block(x, hw_shape)

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

    def _default_init(self) -> None:
        """ViT's initialisation (timm / DeiT): truncated normal (std .02) for the position
        embedding, class token and every Linear, each branch drawn as its own Linear."""
        self._init_embeddings()
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
        the same shapes and would load silently into the wrong function."""
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
        layers, rest = split_vit_layers(state_dict)
        out = vit_embeddings(model, rest)
        out.update(_layers_to_blocks(layers, model))
    pos = out.get('pos_embed')
    if pos is not None:
        out['pos_embed'] = fit_pos_embed(pos, model)
    return out


def _layers_to_blocks(
    layers: Dict[int, Dict[str, torch.Tensor]], model: DepthRepViT
) -> Dict[str, torch.Tensor]:
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
