"""Necks for mmdet and mmseg, registered in mmengine's root ``MODELS`` (``type='SimpleFPN'``)."""

from .simple_fpn import SimpleFPN

__all__ = ['SimpleFPN']
