"""The one error hierarchy of pcd.

Every error pcd raises on purpose derives from :class:`PCDError`. Messages name the thing that is wrong, what was
expected, what was received, and how to fix it, so that a caller can show them to a user as they are.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = [
    "DISTRIBUTION",
    "check_count",
    "pip_install",
    "require",
    "BackendCapabilityError",
    "BackendUnavailableError",
    "ContextError",
    "DatasetError",
    "InputError",
    "LimitError",
    "ModelLoadError",
    "OptionError",
    "PCDError",
    "PromptAlignmentError",
    "QuestionError",
    "RequestCancelled",
    "RequestTimeout",
    "SchemaError",
]


class PCDError(Exception):
    """Base class of every error raised by pcd."""


class SchemaError(PCDError, ValueError):
    """A schema (Pydantic model, JSON Schema or preset) that pcd cannot decide.

    Raised before any model work, so nothing is half-done.
    """


class QuestionError(SchemaError):
    """A decision question given in a wire format (``/v1/decisions``, ``/v1/systemone``) that pcd cannot ask.

    Attributes:
        param: The part of the request at fault (``questions[2].choices[0].value``), as the wire's errors name it.
    """

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class ContextError(PCDError, ValueError):
    """The text to classify is unusable: empty, only whitespace, or longer than the model's window."""


class DatasetError(PCDError, ValueError):
    """A labelled dataset (for ``pcd eval``) that is missing, malformed or unusable."""


class InputError(PCDError, ValueError):
    """A file or text given to the ``pcd`` command that cannot be used: missing, unreadable, or bad JSON."""


class PromptAlignmentError(PCDError, RuntimeError):
    """The prompt did not tokenize the way the compiler assumed.

    Scoring misaligned positions would give silently wrong answers, so pcd refuses instead.
    """


class ModelLoadError(PCDError, OSError):
    """A model name or path could not be resolved or loaded."""


class BackendUnavailableError(PCDError, ImportError):
    """The requested backend's libraries are not installed on this machine."""


class BackendCapabilityError(PCDError, TypeError):
    """A call needs an optional capability its backend does not declare (open rows, feature taps, the plain
    reference; :mod:`pcd_engine.backends.capabilities`). Raised before the request runs a pass."""


class OptionError(PCDError, ValueError):
    """An option passed to pcd is out of range or unknown."""


class LimitError(PCDError, ValueError):
    """A request exceeds a limit: the memory budget, the labels or generated tokens allowed per request.

    Raised before any model work where the size is known up front, so nothing is half-done or cached.
    """


class RequestCancelled(PCDError):
    """A request was cancelled (its client went away); the work stopped at the next pass boundary."""


class RequestTimeout(RequestCancelled):
    """A request ran past its time limit; the work stopped at the next pass boundary."""


DISTRIBUTION = "pcd-llm"
"""pcd's distribution name on PyPI (``pcd`` there is another project); the import names are ``pcd_engine`` and
``pcd_integrations``, and the command is ``pcd``."""


def pip_install(extra: str) -> str:
    """The command that installs pcd with one of its extras, for error messages: ``pip install "pcd-llm[torch]"``."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def require(*modules: str, what: str, install: str) -> list[ModuleType]:
    """Import optional packages, in order, or fail with one message naming the missing one.

    Args:
        *modules: Module names to import (``"llguidance.hf"``, ``"mlx.core"``).
        what: What needs them, for the message (``"Open fields"``, ``"Backend 'mlx'"``).
        install: The command that installs them.

    Returns:
        The imported modules, in order.

    Raises:
        BackendUnavailableError: If one cannot be imported (the message names it, and the import error when it is
            about something else, such as a broken dependency).
    """
    found = []
    for name in modules:
        try:
            found.append(importlib.import_module(name))
        except ImportError as exc:
            missing = exc.name or name
            detail = "" if missing == name or name.startswith(f"{missing}.") else f" ({exc})"
            packages = sorted({m.split(".")[0] for m in modules})
            raise BackendUnavailableError(
                f"{what}: expected {' and '.join(packages)} to be installed, but {missing!r} is missing{detail}. "
                f"Install with: {install}."
            ) from exc
    return found


def check_count(value: Any, name: str, *, minimum: int = 1, optional: bool = True) -> Any:
    """``value`` as a count: an integer (not a bool) >= ``minimum``, or ``None`` when ``optional``. The one check
    behind every count pcd takes (token limits, batch sizes, concurrency, label limits), so they are refused alike.

    Args:
        value: What was given.
        name: The option, for the message (``"max_tokens"``, ``"pcd tag --part-size"``).
        minimum: The smallest allowed count.
        optional: Whether ``None`` (the default's choice) is allowed.

    Returns:
        ``value``.

    Raises:
        OptionError: If ``value`` is anything else, naming ``name``, what was expected and what was received.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{name}: expected an integer >= {minimum}, but got {value!r}.")
    return value
