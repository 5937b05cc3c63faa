"""Decision heads (issue 46): a small linear model per closed field over hidden states of the model's own pass,
fitted from a few labelled examples, and kept as plain JSON tied to the model and schema it was fitted on.

This module owns the head as a value: its numbers, the arithmetic that turns features into a distribution over the
field's labels, fitting one with scikit-learn (:meth:`Head.fit` reads the features from the engine's own passes,
:meth:`~pcd_engine.engine.Engine.read_features`), the held-out distributions its gate
(:mod:`pcd_engine.heads.gates`) compares with the model's own decision, saving, loading and checking it (every
number and label of a file is checked, as a calibration's are; nothing is unpickled). A call decides a field with
its head through the ``head`` option (:class:`~pcd_engine.options.ExtractOptions`).

The feature recipe, measured in the design study (``benchmarks/study_head_features.py``): the last layer's state at
the field's answer position (where its decision is read) beside the middle layer's mean over the document's tokens,
standardized; a multinomial logistic regression with an L2 penalty on top.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pcd_engine.calibrate.fitted import (
    Reader,
    check_fitted_on,
    from_fitted_json,
    read_json_file,
    same_labels,
    write_json_file,
)
from pcd_engine.errors import OptionError
from pcd_engine.heads.fields import FieldHead, fit_flag_head, fit_scaled_head, held_out_yes, tempered
from pcd_engine.heads.gates import Gate, gate, scores
from pcd_engine.heads.thresholds import KeepsHeldOut
from pcd_engine.schema import FieldSpec, Schema

__all__ = ["FEATURE_RECIPES", "FIT_CHUNK", "HEADED_KINDS", "Head", "example_targets", "fold_copies"]

HEADED_KINDS = ("enum", "boolean", "multi")
"""The closed field kinds a head decides (single-label fields, and multi-label ones label by label)."""

FEATURE_RECIPES = ("answer-last+document-middle",)
"""How a head's features are read from the pass: ``"answer-last+document-middle"`` is the last layer's hidden state
at the field's answer position, then the middle layer's (``num_hidden_layers // 2``) mean over the document's
tokens."""

_FORMAT = "pcd-head/1"

FIT_CHUNK = 64
"""Documents whose features :meth:`Head.fit` reads per call of the engine (its ``progress`` is called before each)."""


@dataclass(frozen=True)
class Head(KeepsHeldOut):
    """Decision heads for a schema's closed fields, fitted with one model, kept as JSON. Each single-label field
    keeps its folds' held-out evidence: :meth:`threshold`, :meth:`with_thresholds` and :meth:`set_cutoff`
    (:class:`~pcd_engine.heads.thresholds.KeepsHeldOut`) choose on it.

    Attributes:
        schema_fingerprint: The fingerprint of the schema it was fitted on.
        schema_title: That schema's title, for messages.
        model: The model it was fitted with (:attr:`~pcd_engine.engine.Engine.model_id`).
        features: How the features are read, one of :data:`FEATURE_RECIPES`.
        examples: How many labelled examples it was fitted on.
        fields: One :class:`FieldHead` per field it decides (the others are decided as without a head).
        gates: From :meth:`fit`, each field's head against the model's own decision on held-out examples
            (:class:`~pcd_engine.heads.gates.Gate`); not saved, and empty on a loaded head.
    """

    kept_by: ClassVar[str] = "Head"

    schema_fingerprint: str
    schema_title: str
    model: str
    features: str
    examples: int
    fields: tuple[FieldHead, ...]
    gates: tuple[Gate, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        for name in ("schema_fingerprint", "schema_title", "model"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"Head {name}: expected a string, but got {getattr(self, name)!r}.")
        if self.features not in FEATURE_RECIPES:
            raise OptionError(f"Head features: expected one of {list(FEATURE_RECIPES)}, but got {self.features!r}.")
        if isinstance(self.examples, bool) or not isinstance(self.examples, int) or self.examples < 0:
            raise OptionError(f"Head examples: expected a count (an integer >= 0), but got {self.examples!r}.")
        fields = tuple(self.fields) if isinstance(self.fields, (list, tuple)) else None
        if not fields or not all(isinstance(f, FieldHead) for f in fields):
            raise OptionError(f"Head fields: expected a non-empty list of FieldHead, but got {self.fields!r}.")
        names = [f.name for f in fields]
        if len(set(names)) != len(names) or len({f.width for f in fields}) != 1:
            raise OptionError(f"Head fields: expected each field once, all reading the same features, got {names}.")
        object.__setattr__(self, "fields", fields)

    @classmethod
    def fit(
        cls,
        engine: Reader,
        schema: Any,
        examples: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        fields: Sequence[str] | None = None,
        options: Any = None,
        c: float = 0.1,
        batch_size: int | None = None,
        progress: Callable[[str], None] | None = None,
        require_better: bool = False,
        seed: int = 0,
    ) -> Head:
        """Fit a head per labelled field from ``examples``, read from the engine's own passes, and gate it.

        Each example's text is decided once (closed fields only, nothing generated) with ``options``, keeping the
        features a head reads (:meth:`~pcd_engine.engine.Engine.read_features`); each field's head is fitted on the
        examples that label it (:func:`~pcd_engine.heads.fields.fit_field_head`), its probabilities scaled by a
        temperature fitted on its held-out distributions (:func:`~pcd_engine.heads.fields.fit_scaled_head`; a
        single-label field's). The gate scores each example with a head fitted without it
        (:func:`~pcd_engine.heads.fields.held_out_distributions`, at that temperature; :attr:`Gate.unscaled` before
        it) against the decision the call would make without a head (its correction
        included), with a paired bootstrap interval (:attr:`gates`).

        Few examples work (down to 2 per label; the study's 10 per label read BBC topics at 85%; a label seen once
        is fitted, and scored in the gate by a head that never saw it), unbalanced ones too (the regression weighs
        them as they come); a label no example shows stays possible but is never decided alone
        (:data:`UNSEEN_LOG_ODDS`). Copies (the same text with the same labels) are folded into one before anything
        is read (:attr:`~pcd_engine.heads.gates.Gate.folded` says how many).

        Args:
            engine: The :class:`~pcd_engine.engine.Engine` (its model is the one the head reads).
            schema: The schema (anything :func:`~pcd_engine.schema.compile_schema` takes).
            examples: ``(text, {field: value})`` pairs; a field an example leaves out is not used for that field.
            fields: The fields to fit heads for (``None``: every single-label closed field the examples label).
            options: :class:`~pcd_engine.options.ExtractOptions` or a mapping: the prompt options the head will be
                used with (a ``head`` there is refused).
            c: The inverse L2 penalty of the regressions.
            batch_size: Documents per pass (``None``: the engine's choice).
            progress: Called with a short description before each chunk of :data:`FIT_CHUNK` documents.
            require_better: Refuse (:class:`~pcd_engine.errors.OptionError`) when a field's head is not better than
                the model's own decision beyond chance (:attr:`~pcd_engine.heads.gates.Gate.better`).
            seed: Seeds the held-out folds and the bootstrap.

        Raises:
            OptionError: If there are no examples, one is malformed or gives a value its field does not allow, a
                field's examples show fewer than two labels, the options carry a head, or ``require_better`` and a
                head is not better.
        """
        from pcd_engine.schema import compile_schema

        compiled = compile_schema(schema)
        call = engine.resolve(options).without_fitted("head", where="Head")
        examples, folded = fold_copies(examples)
        targets = example_targets(compiled, examples, fields)
        texts = [text for text, _ in examples]
        rows: list[Any] = []
        for first in range(0, len(texts), FIT_CHUNK):
            chunk = texts[first : first + FIT_CHUNK]
            if progress is not None:
                progress(f"documents {first + 1}-{first + len(chunk)}/{len(texts)}")
            rows += engine.read_features(chunk, compiled, call, fields=list(targets), batch_size=batch_size)
        heads, gates = [], []
        for name, labels in targets.items():
            head, held_gate = _fit_one(compiled.field(name), labels, rows, c=c, seed=seed)
            heads.append(head)
            gates.append(dataclasses.replace(held_gate, folded=folded))
        worse = [g for g in gates if not g.better]
        if require_better and worse:
            raise OptionError("Head: expected each head to beat the model's own decision, but " + "; ".join(
                f"{g.field!r} gained {g.gain * 100:+.1f} points (95% interval {g.interval[0] * 100:+.1f} to "
                f"{g.interval[1] * 100:+.1f}) "
                f"on {g.held_out} held-out examples" for g in worse) + ".")  # fmt: skip
        return cls(compiled.fingerprint, compiled.title, engine.model_id, FEATURE_RECIPES[0], len(texts),
                   tuple(heads), gates=tuple(gates))  # fmt: skip

    def field(self, name: str) -> FieldHead | None:
        """The head of field ``name``, or ``None`` when it has none."""
        return next((f for f in self.fields if f.name == name), None)

    def _why_none(self, entry: Any) -> str:
        return "a multi-label head" if entry.kind == "multi" else "saved without them; refit it"

    def check(self, schema: Schema, model: str) -> None:
        """Refuse a schema or model other than the ones it was fitted on, and fields that do not fit the schema.

        Raises:
            OptionError: On a mismatch, naming both sides.
        """
        check_fitted_on("Head", fingerprint=self.schema_fingerprint, title=self.schema_title, model=self.model,
                        schema=schema, model_id=model)  # fmt: skip
        for head in self.fields:
            try:
                spec = schema.field(head.name)
            except KeyError:
                raise OptionError(f"Head: expected a field of {schema.title!r}, but got {head.name!r}.") from None
            expected = [label.value for label in spec.labels]
            kind = "multi" if spec.kind == "multi" else "single"
            if spec.kind not in HEADED_KINDS or head.kind != kind or not same_labels(head.labels, expected):
                raise OptionError(
                    f"Head field {head.name!r}: expected a {kind}-label field with the labels {expected}, but the "
                    f"head is {head.kind}-label with {list(head.labels)}."
                )

    def to_json(self) -> dict[str, Any]:
        """The head as plain JSON data (what :meth:`save` writes)."""
        return {
            "format": _FORMAT,
            "schema": {"title": self.schema_title, "fingerprint": self.schema_fingerprint},
            "model": self.model,
            "features": self.features,
            "examples": self.examples,
            "fields": [
                {"name": f.name, "labels": list(f.labels), "mean": list(f.mean), "scale": list(f.scale),
                 "weights": [list(r) for r in f.weights], "bias": list(f.bias), "seen": list(f.seen),
                 **({"kind": f.kind} if f.kind != "single" else {}),
                 **({"temperature": f.temperature} if f.temperature != 1.0 else {}),
                 **({"held_out": [list(pair) for pair in f.held_out]} if f.held_out else {}),
                 **({"min_probability": f.min_probability} if f.min_probability is not None else {})}
                for f in self.fields
            ],
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Any, *, where: str = "head") -> Head:
        """A head from :meth:`to_json`'s data, every value checked.

        Raises:
            InputError: If the data is not a head of this format, naming what is wrong.
        """

        def build(data: Mapping[str, Any]) -> Head:
            fields = tuple(
                FieldHead(
                    f["name"],
                    f["labels"],
                    f["mean"],
                    f["scale"],
                    f["weights"],
                    f["bias"],
                    f["seen"],
                    f.get("kind", "single"),
                    f.get("temperature", 1.0),
                    f.get("held_out", ()),
                    f.get("min_probability"),
                )
                for f in data["fields"]
            )
            return cls(data["schema"]["fingerprint"], data["schema"]["title"], data["model"], data["features"],
                       data["examples"], fields)  # fmt: skip

        return from_fitted_json(data, where=where, kind="pcd head", fmt=_FORMAT, build=build)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the head as JSON to ``path``."""
        return write_json_file(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Head:
        """Read a head written by :meth:`save`.

        Raises:
            InputError: If the file is missing, not JSON, or not a head.
        """
        return cls.from_json(read_json_file(path, "Head"), where=f"Head {str(path)!r}")


def example_targets(
    schema: Schema, examples: Sequence[tuple[str, Mapping[str, Any]]], fields: Sequence[str] | None
) -> dict[str, list[Any]]:
    """Per field to fit, each example's label index (for a multi-label field, the set of the labels that apply;
    ``None`` where the example does not label it).

    Raises:
        OptionError: If there are no examples, one is not ``(text, mapping)``, a field is not a closed field with two
            labels or more, a value is not one of its labels, or a field's examples show fewer than two labels (a
            multi-label field: fewer than two examples).
    """
    headed = {s.name: s for s in schema.fields if s.kind in HEADED_KINDS and len(s.labels) > 1}
    if not examples:
        raise OptionError("Head: expected labelled examples to fit on, but got none.")
    for i, example in enumerate(examples):
        if not (isinstance(example, tuple) and len(example) == 2 and isinstance(example[0], str)
                and isinstance(example[1], Mapping)):  # fmt: skip
            raise OptionError(f"Head example {i}: expected (text, {{field: value}}), but got {example!r}.")
    for name in [*(fields or ()), *(n for _, labels in examples for n in labels)]:
        if name not in headed:
            raise OptionError(f"Head: expected a closed field of {list(headed)}, but got {name!r}.")
    labelled = {n for _, labels in examples for n in labels}
    named = [n for n in headed if n in labelled] if fields is None else list(fields)
    return {name: _targets(headed[name], examples) for name in named}


def _targets(spec: FieldSpec, examples: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Any]:
    """Each example's label index for ``spec`` (a multi-label field: the set of indices; ``None`` where it has
    none); at least two labels shown (a multi-label field: two examples)."""
    values = [label.value for label in spec.labels]
    out: list[Any] = []
    for i, (_, labels) in enumerate(examples):
        if spec.name not in labels:
            out.append(None)
            continue
        given = labels[spec.name]
        chosen = given if spec.kind == "multi" and isinstance(given, (list, tuple, set, frozenset)) else [given]
        found = set()
        for value in chosen:
            value = value.value if isinstance(value, enum.Enum) else value  # an Enum member, as the user's model has it
            match = [k for k, v in enumerate(values) if v == value and type(v) is type(value)]
            if not match or (spec.kind == "multi" and chosen is not given):
                what = f"a list of values from {values}" if spec.kind == "multi" else f"one of {values}"
                raise OptionError(f"Head example {i}, field {spec.name!r}: expected {what}, but got {given!r}.")
            found.add(match[0])
        out.append(frozenset(found) if spec.kind == "multi" else found.pop())
    shown = [t for t in out if t is not None]
    if (len(shown) if spec.kind == "multi" else len(set(shown))) < 2:
        what = "two examples" if spec.kind == "multi" else "examples of at least two of its labels"
        raise OptionError(f"Head field {spec.name!r}: expected {what}.")
    return out


def fold_copies(
    examples: Sequence[tuple[str, Mapping[str, Any]]],
) -> tuple[list[tuple[str, Mapping[str, Any]]], int]:
    """``examples`` with copies left out (the same text with the same labels, after the first), and how many were.
    The same text with other labels stays: a disagreement is information, and no head scores it by heart."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for example in examples:
        text, labels = example if isinstance(example, (tuple, list)) and len(example) == 2 else (None, None)
        if not isinstance(text, str) or not isinstance(labels, Mapping):
            kept.append(example)  # malformed: example_targets names it
            continue
        key = (text, json.dumps(labels, sort_keys=True, default=repr))
        if key not in seen:
            seen.add(key)
            kept.append(example)
    return kept, len(examples) - len(kept)


def _fit_one(spec: FieldSpec, labels: Sequence[Any], rows: Sequence[Any], *, c: float, seed: int) -> tuple[
    FieldHead, Gate
]:  # fmt: skip
    """One field's head from its examples' features (``rows``, as :meth:`~pcd_engine.engine.Engine.read_features`
    gives them) and its gate. A multi-label field is gated label by label, every (example, label) one yes/no
    decision."""
    values = [label.value for label in spec.labels]
    shown = [i for i, t in enumerate(labels) if t is not None]
    x = [rows[i][1][spec.name].tolist() for i in shown]
    y = [labels[i] for i in shown]
    if spec.kind != "multi":
        head, held = fit_scaled_head(spec.name, values, x, y, c=c, seed=seed)
        zero = [rows[i][0][spec.name].label_distribution for i in shown]
        scaled = [tempered(p, head.temperature) for p in held]
        held_gate = gate(spec.name, scaled, zero, y, seed=seed)
        return head, dataclasses.replace(held_gate, unscaled=scores(held, y))
    head = fit_flag_head(spec.name, values, x, y, c=c)
    held = held_out_yes(spec.name, values, x, y, c=c, seed=seed)
    zero = [[rows[i][0][spec.name].label_probabilities[v] for v in values] for i in shown]
    pairs = [
        (p[k], z[k], 0 if k in t else 1) for p, z, t in zip(held, zero, y, strict=True) for k in range(len(values))
    ]
    return head, gate(spec.name, [(p, 1 - p) for p, _, _ in pairs], [(z, 1 - z) for _, z, _ in pairs],
                      [g for _, _, g in pairs], seed=seed)  # fmt: skip
