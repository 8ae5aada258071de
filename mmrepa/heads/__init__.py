"""Classification heads for mmpretrain's ``ImageClassifier`` (imports mmpretrain).

Not imported by ``import mmrepa``, which needs neither mmpretrain nor its start-up time:
classification configs list it, ``custom_imports = dict(imports=['mmrepa', 'mmrepa.heads'])``.
"""

from .. import backbones  # noqa: F401  (registers the backbones the heads sit on)
from .metaformer_head import MetaFormerClsHead
from .token_label_head import TokenLabelClsHead

__all__ = ['MetaFormerClsHead', 'TokenLabelClsHead']
