"""mmcv's patch embedding and patch merging, with their norm folded when it is affine.

Both subclasses keep mmcv's forward and state-dict names (``projection``/``reduction``,
``norm``); folding only rewrites the weights and sets ``norm`` to None, which mmcv's forward
already skips. With a LayerNorm nothing folds and :meth:`reparameterize` changes nothing.
"""
import torch
import torch.nn as nn
from mmcv.cnn.bricks.transformer import PatchEmbed, PatchMerging

from ..fold import fold_dtype, is_affine_norm, norm_affine


def _set_bias(layer: nn.Module, bias: torch.Tensor) -> None:
    bias = bias.to(layer.weight)
    if layer.bias is None:
        layer.bias = nn.Parameter(bias)
    else:
        layer.bias.copy_(bias)


class FoldablePatchEmbed(PatchEmbed):
    """:class:`mmcv.cnn.bricks.transformer.PatchEmbed` whose norm folds into the conv.

    An affine norm after the conv (``y = conv(x) * s + t``) folds into the conv:
    ``W' = s · W`` per output channel and ``b' = s · b + t`` (the conv bias is scaled too).
    The adaptive padding is applied to the image before the conv, so the fold is exact on any
    input size.

    Args:
        deploy (bool): Build without the norm if it would fold (load folded checkpoints).
            Default: False.
        **kwargs: As :class:`~mmcv.cnn.bricks.transformer.PatchEmbed`.

    Input (B, C_in, H, W); output ((B, H'*W', embed_dims), (H', W')).
    """

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.deploy = False
        if deploy:
            self._drop_foldable_norm()

    def _drop_foldable_norm(self) -> None:
        if self.norm is not None and is_affine_norm(self.norm):
            self.norm = None
            if self.projection.bias is None:
                _set_bias(self.projection, self.projection.weight.new_zeros(self.embed_dims))
        self.deploy = True

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold an affine norm into the conv, in place; idempotent."""
        if self.deploy:
            return
        if self.norm is not None and is_affine_norm(self.norm):
            conv = self.projection
            dtype = fold_dtype(conv.weight)
            scale, shift = norm_affine(self.norm, dtype)
            bias = (conv.bias.to(dtype) if conv.bias is not None else
                    torch.zeros_like(scale))
            conv.weight.copy_(conv.weight.to(dtype) * scale.view(-1, 1, 1, 1))
            _set_bias(conv, bias * scale + shift)
        self._drop_foldable_norm()


class FoldablePatchMerging(PatchMerging):
    """:class:`mmcv.cnn.bricks.transformer.PatchMerging` whose norm folds into the reduction.

    An affine norm before the reduction Linear (``reduction(x * s + t)``) folds into it:
    ``W' = W · diag(s)`` and ``b' = W t (+ b)``; a reduction built without bias gains one. The
    padding to even sizes happens before the norm, so the fold is exact on any input size.

    Args:
        deploy (bool): Build without the norm if it would fold (load folded checkpoints).
            Default: False.
        **kwargs: As :class:`~mmcv.cnn.bricks.transformer.PatchMerging`.

    Input (B, H*W, C_in) and (H, W); output ((B, H'*W', out_channels), (H', W')).
    """

    def __init__(self, deploy: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.deploy = False
        if deploy:
            self._drop_foldable_norm()

    def _drop_foldable_norm(self) -> None:
        if self.norm is not None and is_affine_norm(self.norm):
            self.norm = None
            if self.reduction.bias is None:
                _set_bias(self.reduction, self.reduction.weight.new_zeros(self.out_channels))
        self.deploy = True

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold an affine norm into the reduction, in place; idempotent."""
        if self.deploy:
            return
        if self.norm is not None and is_affine_norm(self.norm):
            linear = self.reduction
            dtype = fold_dtype(linear.weight)
            scale, shift = norm_affine(self.norm, dtype)
            w = linear.weight.to(dtype)
            bias = w @ shift
            if linear.bias is not None:
                bias = bias + linear.bias.to(dtype)
            linear.weight.copy_(w * scale)
            _set_bias(linear, bias)
        self._drop_foldable_norm()

