"""The ``pcd`` command, one module per sub-command (``models``, ``check``, ``run``, ``decide``, ``bench``,
``eval``, ``calibrate``, ``fit``, ``promote``, ``tag``, ``serve``); :mod:`~pcd_engine.tools.cli.command` holds the
parser and :func:`main`, which this package re-exports as the console script's entry point
(``pcd = "pcd_engine.tools.cli:main"``)."""

from pcd_engine.tools.cli.command import build_parser, main

__all__ = ["build_parser", "main"]
