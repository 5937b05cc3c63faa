"""Test your own model or backend with pcd: :func:`check_backend` runs the conformance checks of ``pcd check``
and returns a :class:`BackendReport`.

Example:
    >>> from pcd_engine import Engine
    >>> from pcd_engine.testing import check_backend
    >>> report = check_backend(Engine.load("path/to/model"), tol=1e-3)  # doctest: +SKIP
    >>> report.passed, [c.name for c in report.failures]  # doctest: +SKIP
    (True, [])
"""

from __future__ import annotations

from pcd_engine.tools.check import BackendReport, Check, check_backend, default_tolerance

__all__ = ["BackendReport", "Check", "check_backend", "default_tolerance"]
