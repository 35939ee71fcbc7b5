"""Kept for old imports: the registry is :mod:`scaleflu.unlearn.registry` (one for every caller)."""

from __future__ import annotations

from scaleflu.unlearn.registry import make_method as get_method
from scaleflu.unlearn.registry import method_names

METHOD_NAMES = method_names()

__all__ = ["METHOD_NAMES", "get_method"]
