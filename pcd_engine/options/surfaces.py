"""Every surface's settings as one call's options: :func:`surface_options`, the one place a CLI flag, a server
field or an adapter's setting becomes an :class:`~pcd_engine.options.ExtractOptions`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcd_engine.errors import OptionError
from pcd_engine.limits import RequestLimits
from pcd_engine.options.extract import ExtractOptions

__all__ = ["surface_options"]


def surface_options(
    *layers: tuple[str, ExtractOptions | Mapping[str, Any] | None],
    temperature: Any = None,
    timeout: Any = None,
    max_tokens: Any = None,
    calibration: Any = None,
    head: Any = None,
) -> ExtractOptions:
    """The options a call from one of pcd's surfaces runs with: the one place where a surface's settings become
    :class:`ExtractOptions` (the CLI's flags, the server's request fields, LangChain's and LlamaIndex's model
    settings and options, Ray's options), so a setting means the same, and is checked the same, everywhere.

    Args:
        *layers: ``(where, options)`` pairs, the first winning field by field: each an :class:`ExtractOptions`, a
            mapping of its field names (an unknown name is refused, naming ``where``), or ``None``.
        temperature: A chat API's ``temperature``, under every layer: a positive number reshapes the structured
            probabilities (the decisions are the same at any temperature); ``0`` or ``None`` keeps the engine's.
        timeout: Seconds a call may run (:attr:`RequestLimits.time_limit_s`), under every layer; ``0`` or ``None``:
            the engine's limits (by default :data:`~pcd_engine.limits.DEFAULT_TIME_LIMIT_S`).
        max_tokens: The most tokens of each open field's value (an integer >= 1), under every layer; ``None``: the
            engine's.
        calibration: A :class:`~pcd_engine.calibrate.calibrator.Calibrator` or its JSON, under every layer.
        head: A :class:`~pcd_engine.heads.head.Head`, its JSON or a saved head's path, under every layer.

    Raises:
        OptionError: If a layer names an unknown option, or a value is out of range (naming it).
    """
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0
    ):
        raise OptionError(f"temperature: expected a number >= 0, but got {temperature!r}.")
    merged = ExtractOptions(
        temperature=temperature or None,
        limits=RequestLimits(time_limit_s=timeout) if timeout else None,
        max_tokens=max_tokens,
        calibration=calibration,
        head=head,
    )
    for where, data in reversed(layers):
        merged = ExtractOptions.parse(data, where=where).over(merged)
    return merged
