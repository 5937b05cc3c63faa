"""Backends: the only code that touches tensors. Each backend file implements :class:`Backend`."""

from pcd_engine.backends.base import Backend, Prefix, RequestState

__all__ = ["Backend", "Prefix", "RequestState"]
