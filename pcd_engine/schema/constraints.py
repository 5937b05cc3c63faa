"""Constraints on values: every JSON Schema keyword narrows a closed field's labels, constrains an open one, or
is refused.

A closed field is decided among its labels, so a keyword that the labels could break (``multipleOf``, bounds,
``not``, ``maxLength`` / ``pattern`` / ``format`` beside an ``enum``) is honoured by dropping the labels that break
it: each candidate value is validated against the field's whole JSON Schema (formats checked), and only the
valid ones are labels. An open field's keywords go to the constrained generator, and its value is validated
against the same schema afterwards. A keyword no validator knows (``nullable``, a misspelt ``maximun``) would
be silently ignored by both, so it is refused with a :class:`~pcd_engine.errors.SchemaError` that names it.

Integer ranges are counted by arithmetic before any list is built, so ``maximum: 1e9`` costs nothing: a range of
more than :data:`MAX_INT_LABELS` values makes the field open (generated) instead of closed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from pcd_engine.errors import SchemaError

__all__ = [
    "MAX_INT_LABELS",
    "MAX_SCHEMA_DEPTH",
    "WideRange",
    "check_depth",
    "check_keywords",
    "filter_values",
    "int_values",
    "is_valid",
    "number_bound",
    "too_deep",
]

# A bounded integer field becomes one label per value; wider ranges are generated instead.
MAX_INT_LABELS = 256
# Containers (objects and arrays) nested deeper than this in one schema are refused before any recursion.
MAX_SCHEMA_DEPTH = 64

# Draft 2020-12 keywords that a validator honours, plus the annotations that constrain nothing.
_VALIDATION = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
        "maxLength", "minLength", "pattern", "format", "not", "anyOf", "oneOf", "allOf", "if", "then", "else",
        "$ref", "$defs", "definitions", "items", "minItems", "maxItems", "uniqueItems", "properties", "required",
        "additionalProperties", "patternProperties", "propertyNames", "minProperties", "maxProperties",
        "dependentRequired", "dependentSchemas", "unevaluatedProperties", "prefixItems",
    }
)  # fmt: skip
_ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$schema", "$id",
        "$comment", "$anchor", "contentMediaType", "contentEncoding", "contentSchema", "discriminator",
    }
)  # fmt: skip
# Array keywords a multi-label field cannot honour: it decides each label alone.
_MULTI_REFUSED = frozenset({"contains", "minContains", "maxContains", "unevaluatedItems", "prefixItems"})


def check_depth(name: str, node: Any) -> None:
    """Refuse a schema whose containers nest deeper than :data:`MAX_SCHEMA_DEPTH`, without recursion.

    Raises:
        SchemaError: If the schema is nested too deeply.
    """
    stack: list[tuple[Any, int]] = [(node, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise too_deep(name)
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def too_deep(name: str) -> SchemaError:
    """The error for a schema nested deeper than :data:`MAX_SCHEMA_DEPTH`."""
    return SchemaError(
        f"Field {name!r}: expected a schema nested at most {MAX_SCHEMA_DEPTH} levels deep, but it nests deeper. "
        "Flatten the schema."
    )


def check_keywords(name: str, node: Mapping[str, Any], *, multi: bool = False) -> None:
    """Refuse the keywords of a field's schema that would be ignored.

    Args:
        name: The field, for the message.
        node: The field's (or value's) schema, references inlined.
        multi: True for a multi-label field, which cannot honour ``contains`` and the like.

    Raises:
        SchemaError: Naming the first keyword that no validator honours (``x-`` extensions are allowed).
    """
    stack: list[tuple[Any, str]] = [(node, "")]
    while stack:
        item, where = stack.pop()
        if not isinstance(item, Mapping):
            continue
        for key, value in item.items():
            at = f"{where}/{key}"
            if not isinstance(key, str) or (key not in _VALIDATION and key not in _ANNOTATIONS):
                if isinstance(key, str) and key.startswith("x-"):
                    continue
                hint = " Use a type list with 'null' instead." if key == "nullable" else ""
                raise SchemaError(
                    f"Field {name!r}: expected JSON Schema keywords pcd can honour, but got {key!r} at {at or '/'}, "
                    f"which no validator checks.{hint} Remove it or spell it as a standard keyword."
                )
            if multi and where == "" and key in _MULTI_REFUSED:
                raise SchemaError(
                    f"Field {name!r}: expected array keywords a multi-label field can honour (items, minItems, "
                    f"maxItems, uniqueItems), but got {key!r}; each label is decided alone."
                )
            if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
                if isinstance(value, Mapping):
                    stack.extend((v, f"{at}/{k}") for k, v in value.items())
            elif isinstance(value, Mapping):
                stack.append((value, at))
            elif isinstance(value, list) and key in ("anyOf", "oneOf", "allOf", "prefixItems"):
                stack.extend((v, f"{at}/{i}") for i, v in enumerate(value))


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    import json

    import jsonschema

    schema = json.loads(schema_json)
    return jsonschema.Draft202012Validator(schema, format_checker=_format_checker())


@lru_cache(maxsize=1)
def _format_checker() -> Any:
    """jsonschema's format checks, with ``date-time`` and ``time`` checked too (jsonschema leaves them unchecked
    unless an optional package is installed): an ISO 8601 date and time of day, as Python reads them."""
    import datetime

    import jsonschema

    checker = jsonschema.FormatChecker()

    @checker.checks("date-time", raises=ValueError)
    def _date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        if len(value) < 11 or value[10] not in "Tt ":
            raise ValueError(f"{value!r} has no time of day")
        datetime.datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "Zz" else value)
        return True

    @checker.checks("time", raises=ValueError)
    def _time(value: object) -> bool:
        if isinstance(value, str):
            datetime.time.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "Zz" else value)
        return True

    return checker


def is_valid(schema: Mapping[str, Any] | bool, value: Any) -> bool:
    """Whether ``value`` validates against ``schema`` (Draft 2020-12, ``format`` checked)."""
    import json

    import jsonschema

    try:
        return bool(_validator(json.dumps(schema, sort_keys=True)).is_valid(value))
    except (jsonschema.SchemaError, RecursionError, ValueError, TypeError):
        return False


def filter_values(name: str, values: Sequence[Any], node: Mapping[str, Any]) -> list[Any]:
    """The values that validate against ``node``, in order.

    Raises:
        SchemaError: If ``node`` is not a valid JSON Schema, or no value is left.
    """
    import json

    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(node)
    except jsonschema.SchemaError as exc:
        raise SchemaError(f"Field {name!r}: expected a valid JSON Schema, but got: {exc.message}.") from None
    validator = _validator(json.dumps(node, sort_keys=True))
    kept = [v for v in values if validator.is_valid(v)]
    if not kept:
        shown = ", ".join(json.dumps(v) for v in list(values)[:5]) + (", ..." if len(values) > 5 else "")
        raise SchemaError(
            f"Field {name!r}: expected at least one allowed value that satisfies the field's constraints, but none "
            f"of [{shown}] does. Loosen the constraints or change the values."
        )
    return kept


def number_bound(name: str, key: str, value: Any) -> Any:
    """A numeric bound (``minimum``, ``ge``, ...) checked to be a finite number (returned as it is); ``None``
    stays ``None``.

    Raises:
        SchemaError: If the bound is not a finite int or float.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not math.isfinite(value):
        raise SchemaError(f"Field {name!r}: expected {key} to be a finite number, but got {value!r}.")
    return value


def int_values(
    name: str, lo: float | None, hi: float | None, *, step: Any = None, exclusive: tuple[bool, bool] = (False, False)
) -> range:
    """The integers in ``[lo, hi]`` (or open ends when ``exclusive``) that are multiples of ``step``.

    The count is computed before anything is built. Fractional bounds round inwards (``minimum: 1.5`` starts at
    2), and a fractional ``multipleOf`` keeps the integers that are multiples of it.

    Args:
        name: The field, for messages.
        lo: Lower bound, or ``None`` for none.
        hi: Upper bound, or ``None`` for none.
        step: ``multipleOf``, or ``None``.
        exclusive: Whether each bound is exclusive.

    Returns:
        The range of values.

    Raises:
        WideRange: When a bound is missing or there are more than :data:`MAX_INT_LABELS` values: the field is
            open.
        SchemaError: If a bound or the step is not a finite number, or the range is empty.
    """
    if lo is None or hi is None:
        raise WideRange
    first = math.floor(lo) + 1 if exclusive[0] else math.ceil(lo)
    last = math.ceil(hi) - 1 if exclusive[1] else math.floor(hi)
    stride = 1
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
            raise SchemaError(f"Field {name!r}: expected multipleOf to be a positive number, but got {step!r}.")
        stride = Fraction(str(step)).numerator  # n is a multiple of p/q (reduced) exactly when p divides n
        first = -((-first) // stride) * stride
    count = 0 if last < first else (last - first) // stride + 1
    if count == 0:
        what = f"{lo}..{hi}" + (f" in steps of {step}" if step is not None else "")
        raise SchemaError(f"Field {name!r}: expected a non-empty integer range, but got {what}.")
    if count > MAX_INT_LABELS:
        raise WideRange
    return range(first, last + 1, stride)


class WideRange(Exception):
    """Internal: an integer range without both bounds, or with more than :data:`MAX_INT_LABELS` values."""
