"""The question types, one object each: yes/no (:data:`YES_NO`), choice (:data:`CHOICE`) and score (:data:`SCORE`).

Each :class:`QuestionType` owns everything that differs between them: the closed field a question becomes (its
values, its checks, its JSON Schema property), how an answer reads back (a yes/no's probability of yes, a score's
expected level), and each wire format: how a question arrives on ``/v1/decisions`` (``predicate``, ``choice``,
``score``) and ``/v1/systemone`` (``noul``, ``choice``, ``score``), and how its answer is written there and for
LangChain's decision models. The routes and the adapters look a type up once (:func:`wire_type`,
:attr:`~pcd_engine.questions.Question.type`) and never compare kinds. Adding a question type is one subclass here
added to :data:`TYPES`, its tests and its docs.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from pcd_engine.errors import ContextError, QuestionError, SchemaError
from pcd_engine.questions.states import content_text
from pcd_engine.schema import LabelValue

__all__ = ["CHOICE", "SCORE", "TYPES", "WIRES", "YES_NO", "Parts", "QuestionType", "wire_type"]

WIRES = ("decisions", "systemone", "langchain")
"""The wire formats a question type writes its answers in: ``/v1/decisions``, ``/v1/systemone``, LangChain's
decision models."""


Parts = tuple[tuple[LabelValue, ...], tuple[str | None, ...]]
"""A question's labels and descriptions, as a type reads them off a wire (:class:`~pcd_engine.questions.Question`
holds them)."""


class Question(Protocol):
    """What a type reads of a question (:class:`pcd_engine.questions.Question`)."""

    @property
    def instructions(self) -> str: ...

    @property
    def labels(self) -> tuple[LabelValue, ...]: ...

    @property
    def descriptions(self) -> tuple[str | None, ...]: ...


class QuestionAnswer(Protocol):
    """What a type reads of an answer (:class:`pcd_engine.questions.QuestionAnswer`)."""

    @property
    def value(self) -> LabelValue: ...

    @property
    def probabilities(self) -> Mapping[LabelValue, float]: ...

    @property
    def confidence(self) -> float: ...

    @property
    def yes(self) -> float | None: ...

    @property
    def score(self) -> float | None: ...


class QuestionType(ABC):
    """One kind of question: its closed field, how its answer reads back, and its wire formats.

    Attributes:
        name: The kind's name in pcd (:attr:`~pcd_engine.questions.Question.kind`).
        wire_names: Its ``type`` on each wire format that names it (``decisions``, ``systemone``).
    """

    name: ClassVar[str]
    wire_names: ClassVar[Mapping[str, str]]

    @abstractmethod
    def values(self, question: Question) -> tuple[LabelValue, ...]:
        """The field's allowed values, in order."""

    @abstractmethod
    def check(self, question: Question, where: str) -> None:
        """Check what this kind asks of a question's labels and descriptions.

        Raises:
            SchemaError: If they do not fit this kind.
        """

    def property(self, question: Question, meanings: str) -> dict[str, Any]:
        """The question's JSON Schema property, given its described values in words (``meanings``)."""
        text = question.instructions.strip() + (f" ({meanings})" if meanings else "")
        return {"enum": list(self.values(question)), "description": text}

    def yes(self, probabilities: Mapping[LabelValue, float]) -> float | None:
        """The probability of yes (a yes/no question's); ``None`` for the other kinds."""
        return None

    def score(self, probabilities: Mapping[LabelValue, float]) -> float | None:
        """The expected level (a score question's); ``None`` for the other kinds."""
        return None

    def expected(self, question: Question, raw: Any, where: str) -> LabelValue:
        """An expected answer as a decision case or an outcome gives it, as one of the field's values.

        Raises:
            QuestionError: If it names no answer of the question (naming ``where``).
        """
        values = self.values(question)
        found = next((v for v in values if v == raw and type(v) is type(raw)), None)
        if found is None:
            raise QuestionError(f"{where}: expected one of {list(values)}, but got {raw!r}.", param=where)
        return found

    @abstractmethod
    def from_decisions(self, raw: Mapping[str, Any], where: str) -> Parts:
        """A ``/v1/decisions`` question of this type: its labels and descriptions.

        Raises:
            QuestionError: Naming the part of the question at fault.
        """

    @abstractmethod
    def from_systemone(self, raw: Mapping[str, Any], where: str) -> Parts:
        """A ``/v1/systemone`` question of this type: its labels and descriptions.

        Raises:
            QuestionError: Naming the part of the question at fault.
        """

    @abstractmethod
    def answer(self, answer: QuestionAnswer, *, wire: str, legend: Sequence[str] = ()) -> dict[str, Any]:
        """The answer in a wire format of :data:`WIRES` (``legend``: a score's level names, lowest first)."""


class YesNo(QuestionType):
    """Yes or no: a boolean field; the answer's ``yes`` is the probability of yes."""

    name = "yes_no"
    wire_names = {"decisions": "predicate", "systemone": "noul"}

    def values(self, question: Question) -> tuple[LabelValue, ...]:
        return (True, False)

    def check(self, question: Question, where: str) -> None:
        if question.labels or len(question.descriptions) != 2:
            raise SchemaError(f"{where}: expected a yes/no question to have no labels and two meanings (yes, no).")

    def property(self, question: Question, meanings: str) -> dict[str, Any]:
        text = question.instructions.strip() + (f" ({meanings})" if meanings else "")
        return {"type": "boolean", "description": text}

    def yes(self, probabilities: Mapping[LabelValue, float]) -> float | None:
        return probabilities[True]

    def expected(self, question: Question, raw: Any, where: str) -> LabelValue:
        """``true``/``false``, ``1``/``0`` or ``"yes"``/``"no"`` (any case)."""
        spelled = raw.strip().lower() if isinstance(raw, str) else raw
        for value, names in ((True, (True, 1, "true", "yes")), (False, (False, 0, "false", "no"))):
            if any(spelled == n and type(spelled) is type(n) for n in names):
                return value
        raise QuestionError(f"{where}: expected true or false (or 1 or 0), but got {raw!r}.", param=where)

    def from_decisions(self, raw: Mapping[str, Any], where: str) -> Parts:
        return (), (None, None)

    def from_systemone(self, raw: Mapping[str, Any], where: str) -> Parts:
        criteria = raw.get("criteria")
        if criteria is not None and not isinstance(criteria, dict):
            message = f"{where}.criteria: expected an object with 'true' and 'false', but got {criteria!r}."
            raise QuestionError(message, param=f"{where}.criteria")
        yes, no = (criteria or {}).get("true"), (criteria or {}).get("false")
        return (), (
            None if yes is None else wire_content(yes, f"{where}.criteria.true"),
            None if no is None else wire_content(no, f"{where}.criteria.false"),
        )

    def answer(self, answer: QuestionAnswer, *, wire: str, legend: Sequence[str] = ()) -> dict[str, Any]:
        if wire == "decisions":
            return {"type": "predicate", "probability": answer.yes}
        return {"type": "noul", "noul": answer.yes}


class Choice(QuestionType):
    """One label of several (strings or booleans): an enum field; the answer is the label and each one's
    probability."""

    name = "choice"
    wire_names = {"decisions": "choice", "systemone": "choice"}

    def values(self, question: Question) -> tuple[LabelValue, ...]:
        return question.labels

    def check(self, question: Question, where: str) -> None:
        if not question.labels or len(question.descriptions) != len(question.labels):
            raise SchemaError(
                f"{where}: expected at least one label, each with a description or None, but got "
                f"{len(question.labels)} labels and {len(question.descriptions)} descriptions."
            )
        bad = next((v for v in question.labels if not isinstance(v, (str, bool))), None)
        if bad is not None:
            raise SchemaError(f"{where}: expected every label to be a string or a boolean, but got {bad!r}.")

    def from_decisions(self, raw: Mapping[str, Any], where: str) -> Parts:
        choices: dict[Any, str | None] = {}
        for j, item in enumerate(wire_items(raw, "choices", where, 1)):
            at = f"{where}.choices[{j}]"
            value = item.get("value") if isinstance(item, dict) else None
            if not isinstance(value, (str, bool)) or value in choices:
                raise QuestionError(
                    f"{at}.value: expected a string or boolean used once, but got {value!r}.", param=f"{at}.value"
                )
            about = item.get("description")
            choices[value] = None if about is None else wire_content(about, f"{at}.description")
        return tuple(choices), tuple(choices.values())

    def from_systemone(self, raw: Mapping[str, Any], where: str) -> Parts:
        criteria = raw.get("criteria")
        if not isinstance(criteria, dict) or not criteria:
            message = f"{where}.criteria: expected an object of label to description, but got {criteria!r}."
            raise QuestionError(message, param=f"{where}.criteria")
        labels = {k: None if v is None else wire_content(v, f"{where}.criteria.{k}") for k, v in criteria.items()}
        return tuple(labels), tuple(labels.values())

    def answer(self, answer: QuestionAnswer, *, wire: str, legend: Sequence[str] = ()) -> dict[str, Any]:
        if wire == "decisions":
            probabilities: Any = [{"value": v, "probability": p} for v, p in answer.probabilities.items()]
        else:
            probabilities = dict(answer.probabilities)
        return {"type": "choice", "choice": answer.value, "probabilities": probabilities,
                "confidence": answer.confidence}  # fmt: skip


class Score(QuestionType):
    """A level of an ordered rubric: levels ``0 .. n-1``, lowest first; the answer's ``score`` is the expected
    level (probability-weighted, so it may fall between levels)."""

    name = "score"
    wire_names = {"decisions": "score", "systemone": "score"}

    def values(self, question: Question) -> tuple[LabelValue, ...]:
        return tuple(range(len(question.descriptions)))

    def check(self, question: Question, where: str) -> None:
        if question.labels or len(question.descriptions) < 2 or any(d is None for d in question.descriptions):
            raise SchemaError(
                f"{where}: expected at least two levels, each described, but got {list(question.descriptions)}."
            )

    def property(self, question: Question, meanings: str) -> dict[str, Any]:
        return super().property(question, "The levels, lowest first: " + meanings if meanings else "")

    def score(self, probabilities: Mapping[LabelValue, float]) -> float | None:
        return sum(i * p for i, p in enumerate(probabilities.values()))  # the levels are 0 .. n-1, in order

    def expected(self, question: Question, raw: Any, where: str) -> LabelValue:
        """A level's number (``0 .. n-1``), or its name: its text, or the label before its ``": "``."""
        levels = question.descriptions
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(levels):
            return raw
        if isinstance(raw, str):
            for i, level in enumerate(levels):
                if level is not None and raw.strip() in (level, level.split(": ", 1)[0]):
                    return i
        raise QuestionError(
            f"{where}: expected a level 0 to {len(levels) - 1} or one of its names {list(levels)}, but got {raw!r}.",
            param=where,
        )

    def from_decisions(self, raw: Mapping[str, Any], where: str) -> Parts:
        levels = []
        for j, item in enumerate(wire_items(raw, "levels", where, 2)):
            at = f"{where}.levels[{j}]"
            label = item.get("label") if isinstance(item, dict) else None
            if not isinstance(label, str) or not label.strip():
                raise QuestionError(f"{at}.label: expected text, but got {label!r}.", param=at)
            about = item.get("description")
            levels.append(label if about is None else f"{label}: {wire_content(about, f'{at}.description')}")
        return (), tuple(levels)

    def from_systemone(self, raw: Mapping[str, Any], where: str) -> Parts:
        levels = wire_items(raw, "criteria", where, 2)
        return (), tuple(wire_content(c, f"{where}.criteria[{j}]") for j, c in enumerate(levels))

    def answer(self, answer: QuestionAnswer, *, wire: str, legend: Sequence[str] = ()) -> dict[str, Any]:
        if wire == "decisions":
            rows = [
                {"value": v, "label": legend[i], "probability": p}
                for i, (v, p) in enumerate(answer.probabilities.items())
            ]
            return {"type": "score", "score": answer.score, "probabilities": rows, "confidence": answer.confidence}
        if wire == "systemone":
            named: Mapping[Any, str] = {str(i): level for i, level in enumerate(legend)}
            probabilities: Mapping[Any, float] = {str(k): p for k, p in answer.probabilities.items()}
        else:
            named, probabilities = dict(enumerate(legend)), dict(answer.probabilities)
        return {"type": "score", "score": answer.score, "legend": named, "probabilities": probabilities,
                "confidence": answer.confidence}  # fmt: skip


YES_NO, CHOICE, SCORE = YesNo(), Choice(), Score()
TYPES: Mapping[str, QuestionType] = {t.name: t for t in (YES_NO, CHOICE, SCORE)}
"""Every question type by its name in pcd."""


def wire_type(wire: str, name: Any, *, where: str) -> QuestionType:
    """The question type a wire format names ``name`` (``"predicate"`` on ``/v1/decisions`` is :data:`YES_NO`).

    Raises:
        QuestionError: If the wire names no such type (naming ``where.type``).
    """
    by_name = {t.wire_names[wire]: t for t in TYPES.values() if wire in t.wire_names}
    found = by_name.get(name) if isinstance(name, str) else None
    if found is None:
        known = list(by_name)
        expected = ", ".join(repr(k) for k in known[:-1]) + f" or {known[-1]!r}"
        raise QuestionError(f"{where}.type: expected {expected}, but got {name!r}.", param=f"{where}.type")
    return found


def wire_content(value: Any, where: str) -> str:
    """Instructions or a description of a wire question, as text (:func:`content_text`).

    Raises:
        QuestionError: For media, or what is not JSON (naming ``where``).
    """
    try:
        return content_text(value, where=where)
    except ContextError as exc:
        raise QuestionError(f"{where}: {exc}", param=where) from None


def wire_items(raw: Mapping[str, Any], key: str, where: str, least: int) -> list[Any]:
    """A wire question's list ``key`` of at least ``least`` items.

    Raises:
        QuestionError: If it is not such a list (naming ``where.key``).
    """
    items = raw.get(key)
    if not isinstance(items, list) or len(items) < least:
        raise QuestionError(f"{where}.{key}: expected a list of at least {least}, but got {items!r}.",
                            param=f"{where}.{key}")  # fmt: skip
    return items


def property_meanings(question: Question, values: Sequence[LabelValue]) -> str:
    """The described values of a question, in words: ``"x" means: ...; "y" means: ...``."""
    described = [(v, d) for v, d in zip(values, question.descriptions, strict=False) if d and d.strip()]
    return "; ".join(f"{json.dumps(v, ensure_ascii=False)} means: {d.strip()}" for v, d in described)
