"""Typed questions decided together: the engine's side of the decision-model interfaces.

A request asks several questions about one state: yes or no (:meth:`Question.yes_no`), one label of several
(:meth:`Question.choice`), or a level of an ordered rubric (:meth:`Question.score`). Each question becomes one
closed field of one schema (:func:`questions_schema`), so every question of a request is decided together, as an
extraction is: one tree-packed pass per wave on the schema's cached prompt, each label scored exactly however many
tokens it has, the call's correction, calibration or head applied as to any field. :func:`read_decisions` reads the
answers from the result; :func:`decide_questions` does both for a batch of states in one engine call.

What an answer holds (:class:`QuestionAnswer`):

* yes/no: ``yes``, the probability of yes;
* choice: the chosen label and every label's probability;
* score: the levels are ``0 .. n-1`` in the order given; ``score`` is the expected level (probability-weighted, so
  it may fall between levels) and ``value`` the most probable one.

``confidence`` (choice and score) is how concentrated the distribution is, not the chosen label's probability:
``1 - H(p) / log(K)`` for ``K`` labels, the entropy ``H`` in nats. It is 1 when all the mass is on one label, 0 when
it is spread evenly, and 1 for a question with one label.

The state is text, JSON, or a conversation (:func:`~pcd_engine.questions.states.state_text`). What differs between
the kinds of question is each kind's object (:mod:`pcd_engine.questions.kinds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pcd_engine.errors import ContextError, QuestionError, SchemaError
from pcd_engine.questions.kinds import TYPES, QuestionType, property_meanings, wire_content, wire_type
from pcd_engine.questions.states import state_text
from pcd_engine.result import ExtractionResult, FieldResult, TokenUsage
from pcd_engine.schema import LabelValue, Schema, compile_schema

if TYPE_CHECKING:
    from pcd_engine.engine import Engine
    from pcd_engine.options import ExtractOptions

__all__ = [
    "Decisions",
    "Question",
    "QuestionAnswer",
    "QuestionKind",
    "concentration",
    "decide_questions",
    "questions_schema",
    "read_decisions",
]

QuestionKind = Literal["yes_no", "choice", "score"]


@dataclass(frozen=True)
class Question:
    """One typed question about a state.

    Build it with :meth:`yes_no`, :meth:`choice` or :meth:`score`; :func:`questions_schema` checks it.

    Attributes:
        kind: ``"yes_no"``, ``"choice"`` or ``"score"``.
        instructions: The question, in full.
        labels: A choice's labels (strings or booleans), in order; empty for the other kinds.
        descriptions: What each label means: a choice's per label (``None`` for none), a score's per level (the
            rubric, lowest first; at least two), a yes/no question's meanings of yes and of no (``None`` for none).
    """

    kind: QuestionKind
    instructions: str
    labels: tuple[LabelValue, ...] = ()
    descriptions: tuple[str | None, ...] = ()

    @classmethod
    def yes_no(cls, instructions: str, *, yes: str | None = None, no: str | None = None) -> Question:
        """A yes/no question; ``yes`` and ``no`` say what counts as each."""
        return cls("yes_no", instructions, (), (yes, no))

    @classmethod
    def choice(cls, instructions: str, labels: Mapping[Any, str | None] | Sequence[Any]) -> Question:
        """One label out of ``labels``: a mapping of label to its description (or ``None``), or a list of labels."""
        if isinstance(labels, Mapping):
            return cls("choice", instructions, tuple(labels), tuple(labels.values()))
        return cls("choice", instructions, tuple(labels), tuple(None for _ in labels))

    @classmethod
    def score(cls, instructions: str, levels: Sequence[str]) -> Question:
        """A level of an ordered rubric: ``levels`` describe levels ``0 .. n-1``, lowest first."""
        return cls("score", instructions, (), tuple(levels))

    @classmethod
    def from_wire(cls, kind: QuestionType, wire: str, raw: Mapping[str, Any], where: str) -> Question:
        """A question of type ``kind`` as a wire format sends it (``"decisions"``: a ``/v1/decisions`` question;
        ``"systemone"``: a ``/v1/systemone`` one); the caller looks the type up once
        (:func:`~pcd_engine.questions.kinds.wire_type`).

        Raises:
            QuestionError: Naming the part of the question at fault (``where.instructions``,
                ``where.choices[0].value``).
        """
        instructions = wire_content(raw.get("instructions"), f"{where}.instructions")
        reader = kind.from_decisions if wire == "decisions" else kind.from_systemone
        labels, descriptions = reader(raw, where)
        return cls(kind.name, instructions, labels, descriptions)  # type: ignore[arg-type]

    @classmethod
    def named_from_decisions(cls, raw: Any, where: str) -> tuple[str, Question]:
        """One ``/v1/decisions`` question (``{"name", "type", "instructions", ...}``) with its name.

        Raises:
            QuestionError: Naming the part of the question at fault (``where.name``, ``where.type``, ...).
        """
        kind = wire_type("decisions", raw.get("type") if isinstance(raw, dict) else None, where=where)
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise QuestionError(f"{where}.name: expected a non-empty string.", param=f"{where}.name")
        return name, cls.from_wire(kind, "decisions", raw, where)

    @property
    def type(self) -> QuestionType:
        """The question's type (:mod:`pcd_engine.questions.kinds`), which owns what differs between kinds.

        Raises:
            SchemaError: If :attr:`kind` names no type.
        """
        found = TYPES.get(self.kind) if isinstance(self.kind, str) else None
        if found is None:
            raise SchemaError(f"Question: expected a kind in {list(TYPES)}, but got {self.kind!r}.")
        return found

    @property
    def values(self) -> tuple[LabelValue, ...]:
        """The field's allowed values: ``True, False``; the labels; or the levels ``0 .. n-1``."""
        return self.type.values(self)

    def check(self, name: str) -> None:
        """Check the question, naming it.

        Raises:
            SchemaError: If a part of it is missing or of the wrong type.
        """
        where = f"Question {name!r}"
        kind = TYPES.get(self.kind) if isinstance(self.kind, str) else None
        if kind is None:
            raise SchemaError(f"{where}: expected a kind in {list(TYPES)}, but got {self.kind!r}.")
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise SchemaError(f"{where}: expected instructions as non-empty text, but got {self.instructions!r}.")
        for i, text in enumerate(self.descriptions):
            if text is not None and not isinstance(text, str):
                raise SchemaError(f"{where}: expected description {i} to be text or None, but got {text!r}.")
        kind.check(self, where)

    def field_schema(self) -> dict[str, Any]:
        """The question as a JSON Schema property: its values, and a description that says what each means."""
        return self.type.property(self, property_meanings(self, self.values))


@dataclass(frozen=True)
class QuestionAnswer:
    """The answer to one question, with the engine's evidence for it.

    Attributes:
        name: The question's id.
        kind: The question's kind.
        value: The most probable answer: ``True``/``False``, a label, or a level.
        probabilities: Every answer's probability, in the question's order (``True`` then ``False``; the labels;
            the levels), after the call's correction, calibration or head.
        confidence: How concentrated :attr:`probabilities` is (:func:`concentration`).
        field: The engine's result for the question's field: method, correction, the model's raw distribution.
    """

    name: str
    kind: QuestionKind
    value: LabelValue
    probabilities: Mapping[LabelValue, float]
    confidence: float
    field: FieldResult

    @property
    def type(self) -> QuestionType:
        """The question's type (:mod:`pcd_engine.questions.kinds`): what writes this answer in each wire format."""
        return TYPES[self.kind]

    @property
    def yes(self) -> float | None:
        """A yes/no question's probability of yes; ``None`` for the other kinds."""
        return self.type.yes(self.probabilities)

    @property
    def score(self) -> float | None:
        """A score question's expected level (``sum(level * p)``); ``None`` for the other kinds."""
        return self.type.score(self.probabilities)

    @property
    def abstained(self) -> bool:
        """Whether the call abstained on this question (its probability was below ``min_probability`` or the
        head's threshold, :attr:`~pcd_engine.result.evidence.FieldResult.abstained`)."""
        return bool(getattr(self.field, "abstained", False))  # answers built by hand may carry no field

    @property
    def refusal(self) -> str | None:
        """Why the call abstained, as a refusal says it; ``None`` when it did not."""
        if not self.abstained:
            return None
        return (f"Abstained: the most probable answer {self.field.value!r} has probability "
                f"{self.field.probability:.3f}, below the threshold of the call.")  # fmt: skip

    def wire(self, wire: str, *, legend: Sequence[str] = ()) -> dict[str, Any]:
        """This answer in a wire format (``"decisions"``, ``"systemone"``, ``"langchain"``; ``legend``: a score's
        level names, lowest first), as its type writes it. An abstained answer is the Decisions wire's refusal
        (``{"type": "refusal", "refusal": why, "pcd": the answer}``); the other formats have none, and keep the
        answer (the route's ``pcd`` evidence marks it ``abstained``)."""
        answer = self.type.answer(self, wire=wire, legend=legend)
        if wire == "decisions" and self.abstained:
            return {"type": "refusal", "refusal": self.refusal, "pcd": answer}
        return answer


@dataclass(frozen=True)
class Decisions:
    """Every answer of one state.

    Attributes:
        answers: The answers by question id, in the questions' order.
        usage: Tokens read (the prompt) and written (none: every answer is scored).
        result: The engine's result, whose fields are the questions'.
    """

    answers: Mapping[str, QuestionAnswer]
    usage: TokenUsage
    result: ExtractionResult


def concentration(probabilities: Sequence[float]) -> float:
    """``1 - H(p) / log(K)``: 1 for all the mass on one of the ``K`` labels, 0 for an even spread, 1 when ``K`` is 1."""
    k = len(probabilities)
    if k < 2:
        return 1.0
    entropy = -sum(p * math.log(p) for p in probabilities if p > 0)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(k)))


def questions_schema(questions: Mapping[str, Question]) -> Schema:
    """The schema that asks ``questions``: one closed field per question, named by its id, in order.

    Raises:
        SchemaError: If there are no questions, an id is not a non-empty string, or a question is malformed.
    """
    if not isinstance(questions, Mapping) or not questions:
        raise SchemaError(f"Questions: expected a non-empty mapping of id to question, but got {questions!r}.")
    properties = {}
    for name, question in questions.items():
        if not isinstance(name, str) or not name.strip():
            raise SchemaError(f"Questions: expected every id to be a non-empty string, but got {name!r}.")
        if not isinstance(question, Question):
            raise SchemaError(f"Question {name!r}: expected a Question, but got {type(question).__name__}.")
        question.check(name)
        properties[name] = question.field_schema()
    return compile_schema(
        {"title": "Decisions", "type": "object", "properties": properties, "required": list(properties)}
    )


def read_decisions(result: ExtractionResult, questions: Mapping[str, Question]) -> Decisions:
    """The answers to ``questions`` from an extraction of :func:`questions_schema`."""
    answers = {}
    for name, question in questions.items():
        field = result.fields[name]
        values = question.values
        if field.label_distribution is not None:
            probs = [float(p) for p in field.label_distribution]
        else:  # one label
            probs = [1.0 if v == field.value else 0.0 for v in values]
        answers[name] = QuestionAnswer(
            name, question.kind, field.value, dict(zip(values, probs, strict=True)), concentration(probs), field
        )
    usage = TokenUsage(result.stats.prompt_tokens, result.stats.generated_tokens)
    return Decisions(answers, usage, result)


def decide_questions(
    engine: Engine,
    states: Sequence[Any],
    questions: Mapping[str, Question],
    *,
    options: ExtractOptions | Mapping[str, Any] | None = None,
    return_exceptions: bool = False,
    cancelled: Callable[[], bool] | None = None,
) -> list[Any]:
    """Answer ``questions`` about every state in ONE engine call (:meth:`Engine.extract_many`: one pass per wave
    for the whole batch).

    Args:
        engine: The engine.
        states: The states: text, JSON, or conversations (:func:`state_text`).
        questions: The questions by id.
        options: Extraction options (correction, calibration, head, temperature, ...), as for any extraction.
        return_exceptions: Put a failing state's exception in its place instead of raising it.
        cancelled: Checked before every pass, as for :meth:`Engine.extract`.

    Returns:
        One :class:`Decisions` per state, in order (or its exception, with ``return_exceptions``).

    Raises:
        SchemaError: If a question is malformed (before any model work).
        ContextError: If a state cannot be read, unless ``return_exceptions``.
        PCDError: A state's failure, unless ``return_exceptions``.
    """
    schema = questions_schema(questions)
    texts: list[Any] = []
    for i, state in enumerate(states):
        try:
            texts.append(state_text(state, where=f"states[{i}]"))
        except ContextError as exc:
            if not return_exceptions:
                raise
            texts.append(exc)
    readable = [t for t in texts if not isinstance(t, Exception)]
    results = iter(
        engine.extract_many(readable, schema, options, return_exceptions=return_exceptions, cancelled=cancelled)
    )
    out: list[Any] = []
    for text in texts:
        got = text if isinstance(text, Exception) else next(results)
        out.append(got if isinstance(got, Exception) else read_decisions(got, questions))
    return out
