"""What the adapters share: one engine per loaded model in a process (:meth:`Engine.shared`), and how their
settings are read."""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Collection, Mapping
from typing import Any, Literal

from pcd_engine import Engine, OptionError, PCDError

__all__ = ["fitted_json", "read_settings", "refuse_sampling", "shared_engine"]


def shared_engine(model: str | None, backend: str) -> Engine:
    """The process's engine for ``model`` on ``backend`` (:meth:`Engine.shared`, keyed by what it loads): adapters
    are cheap to build, models are not."""
    return Engine.shared(model, backend=backend)


def read_settings(
    owner: str, data: dict[str, Any], known: Collection[str], *, others: Literal["warn", "refuse"]
) -> dict[str, Any]:
    """Check a constructor's arguments: ``model_name`` is another name for ``model``; an unknown argument close to
    a known one is a typo and refused; any other unknown one is dropped with a ``UserWarning`` (``others="warn"``)
    or refused (``others="refuse"``); ``timeout`` must be positive; a ``calibration`` or ``head`` is kept as its
    JSON data (:func:`fitted_json`).

    Args:
        owner: The class, for messages.
        data: The arguments given.
        known: The arguments the class takes.
        others: What happens to an unknown argument that is no typo.

    Returns:
        The arguments to build with.

    Raises:
        OptionError: On a typo, a refused argument, two names for different models, or a bad ``timeout``.
    """
    data = dict(data)
    for kind in ("calibration", "head"):
        if kind in data and kind in known:
            data[kind] = fitted_json(data[kind], owner=owner, kind=kind)
    if "model_name" in data and "model_name" not in known:
        name = data.pop("model_name")
        if data.get("model") not in (None, name):
            raise OptionError(f"{owner}: model={data['model']!r} and model_name={name!r} name different models.")
        data["model"] = name
    for key in [k for k in data if k not in known]:
        near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
        if near:
            raise OptionError(f"{owner}: unknown argument {key!r}. Did you mean {near[0]!r}?")
        if others == "refuse":
            raise OptionError(
                f"{owner}: unknown argument {key!r}: pcd runs a local model and has no such setting "
                f"(expected one of {sorted(k for k in known if not k.startswith('_'))})."
            )
        warnings.warn(f"{owner}: {key!r} is ignored: pcd runs a local model and has no such setting.", UserWarning, 5)
        del data[key]
    if data.get("timeout") is not None and not data["timeout"] > 0:
        raise OptionError(f"{owner}: timeout: expected a positive number of seconds, but got {data['timeout']}.")
    if data.get("temperature") is not None and not data["temperature"] >= 0:
        raise OptionError(f"{owner}: temperature: expected a number >= 0, but got {data['temperature']}.")
    return data


def fitted_json(value: Any, *, owner: str, kind: str = "calibration") -> dict[str, Any] | None:
    """A fitted value given to an adapter (``kind`` ``"calibration"``: a
    :class:`~pcd_engine.calibrate.calibrator.Calibrator`; ``"head"``: a :class:`~pcd_engine.heads.head.Head`),
    as the object, its JSON data or the path of its file (as ``pcd calibrate`` / ``pcd fit`` write them), kept as
    JSON data: what the adapter keeps, so that it serializes.

    Raises:
        OptionError: If it is none of those.
        InputError: If the file cannot be read or is not of that kind.
    """
    from pcd_engine import Calibrator, Head

    cls: Any = {"calibration": Calibrator, "head": Head}[kind]
    if value is None:
        return None
    if isinstance(value, cls):
        return value.to_json()  # type: ignore[no-any-return]
    if isinstance(value, (str, os.PathLike)):
        return cls.load(value).to_json()  # type: ignore[no-any-return]
    if isinstance(value, Mapping):
        return cls.from_json(value).to_json()  # type: ignore[no-any-return]
    raise OptionError(
        f"{owner} {kind}: expected a {cls.__name__}, its JSON or the path of its file, but got {type(value).__name__}."
    )


def own_error(exc: Exception) -> Exception:
    """pcd's own error inside a pydantic ``ValidationError`` (what a model validator's OptionError becomes when
    pydantic builds an adapter), so the caller gets pcd's typed error, not pydantic's wrapper; ``exc`` otherwise."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    for error in errors:
        inner = (error.get("ctx") or {}).get("error")
        if isinstance(inner, PCDError):
            return inner
    return exc


def reply_time_limit(engine: Any, timeout: float | None) -> float | None:
    """Seconds a free-text reply may take: the call's or the adapter's ``timeout``, else the engine's time limit
    (:data:`~pcd_engine.limits.DEFAULT_TIME_LIMIT_S` unless the engine was given other limits), as a structured
    call's is."""
    return timeout or engine.options.limits.time_limit_s


def refuse_sampling(owner: str, temperature: float | None) -> None:
    """Free text is greedy: a positive temperature is refused there rather than ignored.

    Raises:
        OptionError: If ``temperature`` is positive.
    """
    if temperature:
        raise OptionError(
            f"{owner}: temperature={temperature} asks for sampled free text, but pcd writes free text greedily. "
            "Use temperature=0 (or None) for free text; it reshapes structured probabilities only."
        )
