"""Fitted decision models served by name: ``pcd serve --head NAME=FILE`` (a folder of ``NAME.head.json`` files too)
serves each head as a model ``NAME`` beside the base model, and ``--shadow NAME=FILE`` runs a candidate head beside
the live one, its decision logged, never answered.

A request naming ``NAME`` (its ``model``, on ``/v1`` and on ``/api/extract``) is decided with that head, as
the same head sent in the request (``pcd.head``) decides it; a request whose schema or questions are not the head's
is refused, naming what differs (:func:`mismatch`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pcd_engine.errors import InputError, OptionError
from pcd_engine.heads.head import Head
from pcd_engine.schema import Schema

__all__ = ["ServedHead", "mismatch", "served_heads"]

SUFFIX = ".head.json"
"""The file name ending of a head in a folder given to ``--head`` (the rest of the name is the served name)."""


@dataclass(frozen=True)
class ServedHead:
    """A head served as a model.

    Attributes:
        name: The model name requests use.
        head: The live head, which answers.
        path: Where the live head was read from (absolute).
        shadow: A candidate head decided beside the live one and logged (``None``: none).
        shadow_path: Where the candidate was read from (absolute; the log names it, ``pcd promote`` finds it).
    """

    name: str
    head: Head
    path: str
    shadow: Head | None = None
    shadow_path: str | None = None


def served_heads(
    heads: Iterable[str], shadows: Iterable[str] = (), *, model_id: str, taken: Iterable[str] = ()
) -> dict[str, ServedHead]:
    """The heads of ``--head`` (``NAME=FILE``, or a folder of ``NAME.head.json`` files) with the candidates of
    ``--shadow NAME=FILE`` beside them, each read and checked to be fitted with ``model_id``.

    Args:
        heads: ``NAME=FILE`` or ``FOLDER`` specs.
        shadows: ``NAME=FILE`` specs, each naming a served head.
        model_id: The served model (every head must be fitted with it).
        taken: Names the base model is served under (a head cannot take one).

    Raises:
        InputError: For a spec that is neither, a name used twice or taken, a file that is not a head, a head of
            another model, or a shadow of a name no head serves or of another schema.
    """
    found: dict[str, tuple[Head, str]] = {}
    reserved = set(taken)
    for spec in heads:
        for name, path in _specs(spec, "--head"):
            if name in found or name in reserved:
                why = "the base model's" if name in reserved else "another head's"
                raise InputError(f"--head {spec!r}: expected a new model name, but {name!r} is {why}.")
            found[name] = (_read(path, "--head", model_id), str(Path(path).resolve()))
    candidates: dict[str, tuple[Head, str]] = {}
    for spec in shadows:
        for name, path in _specs(spec, "--shadow", folders=False):
            if name not in found:
                raise InputError(f"--shadow {spec!r}: expected the name of a --head, one of {sorted(found)}.")
            head, candidate = found[name][0], _read(path, "--shadow", model_id)
            if candidate.schema_fingerprint != head.schema_fingerprint:
                raise InputError(f"--shadow {spec!r}: expected a head of the live head's schema "
                                 f"({head.schema_title!r}), but it was fitted on "
                                 f"{candidate.schema_title!r}.")  # fmt: skip
            candidates[name] = (candidate, str(Path(path).resolve()))
    return {
        name: ServedHead(name, head, path, *candidates.get(name, (None, None))) for name, (head, path) in found.items()
    }


def mismatch(head: Head, schema: Schema) -> str | None:
    """What differs between the schema a head was fitted on and ``schema`` (``None``: nothing), in words: the
    fields (questions) one has and the other lacks, a field's labels, or, when those agree, the instructions or
    descriptions (the fingerprint)."""
    try:
        head.check(schema, head.model)
    except OptionError:
        pass
    else:
        return None
    names = [f.name for f in head.fields]
    keys = [spec.name for spec in schema.fields]
    missing = [n for n in names if n not in keys]
    if missing:
        return f"the head decides {names}, and the request has no {missing}"
    for field in head.fields:
        labels = list(schema.field(field.name).values)
        if labels != list(field.labels):
            return f"{field.name!r} has the labels {list(field.labels)} in the head, and {labels} in the request"
    extra = [k for k in keys if k not in names]
    if extra:
        return f"the head was fitted on {names} only, and the request also asks {extra}"
    return ("the request has the same fields and labels with other instructions or descriptions (the head's schema "
            f"fingerprint {head.schema_fingerprint}, the request's {schema.fingerprint})")  # fmt: skip


def _specs(spec: str, flag: str, *, folders: bool = True) -> list[tuple[str, str]]:
    """``(name, path)`` pairs of one spec: ``NAME=FILE``, or every ``NAME.head.json`` in a folder."""
    name, sep, path = spec.partition("=")
    if sep:
        if not name.strip() or not path.strip():
            raise InputError(f"{flag} {spec!r}: expected NAME=FILE.")
        return [(name.strip(), path.strip())]
    if folders and Path(spec).is_dir():
        files = sorted(Path(spec).glob(f"*{SUFFIX}"))
        if not files:
            raise InputError(f"{flag} {spec!r}: expected a folder holding NAME{SUFFIX} files, but it holds none.")
        return [(f.name[: -len(SUFFIX)], str(f)) for f in files]
    expected = "NAME=FILE or a folder of heads" if folders else "NAME=FILE"
    raise InputError(f"{flag} {spec!r}: expected {expected}.")


def _read(path: str | os.PathLike[str], flag: str, model_id: str) -> Head:
    """A head file, fitted with ``model_id``."""
    head = Head.load(path)
    if head.model != model_id:
        raise InputError(
            f"{flag} {str(path)!r}: expected a head fitted with the served model {model_id!r}, but it was fitted "
            f"with {head.model!r}."
        )
    return head
