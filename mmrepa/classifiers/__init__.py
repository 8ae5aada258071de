"""Classifiers for mmpretrain (imports mmpretrain; list ``'mmrepa.classifiers'`` in a config's
``custom_imports``, as ``mmrepa.heads``)."""

from .. import backbones  # noqa: F401  (registers the backbones the classifiers sit on)
from .diversity import DiversityImageClassifier

__all__ = ['DiversityImageClassifier']
