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

The state is text, JSON, or a conversation (:func:`state_text`): a conversation (OpenAI-style messages, at the
root) reads as a transcript with each turn's role; any other JSON object or array reads as indented JSON, messages
nested in it included. Media (images, audio, files) are refused: pcd reads text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pcd_engine.errors import ContextError, SchemaError
from pcd_engine.result import ExtractionResult, FieldResult, TokenUsage
from pcd_engine.schema import LabelValue, Schema, compile_schema
from pcd_engine.tool_calls import called_text, tool_result_text

if TYPE_CHECKING:
    from pcd_engine.engine import Engine
    from pcd_engine.options import ExtractOptions

__all__ = [
    "Decisions",
    "Question",
    "QuestionAnswer",
    "QuestionKind",
    "concentration",
    "content_text",
    "decide_questions",
    "questions_schema",
    "read_decisions",
    "state_text",
]

QuestionKind = Literal["yes_no", "choice", "score"]
KINDS: tuple[QuestionKind, ...] = ("yes_no", "choice", "score")
MEDIA = frozenset({"image", "image_url", "input_image", "file", "input_file", "audio", "input_audio", "video"})
"""Content-block types that carry media, in LangChain's and OpenAI's shapes."""
ROLES = {"user": "User", "assistant": "Assistant", "system": "System", "developer": "System", "tool": "Tool"}
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


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

    @property
    def values(self) -> tuple[LabelValue, ...]:
        """The field's allowed values: ``True, False``; the labels; or the levels ``0 .. n-1``."""
        if self.kind == "yes_no":
            return (True, False)
        if self.kind == "score":
            return tuple(range(len(self.descriptions)))
        return self.labels

    def check(self, name: str) -> None:
        """Check the question, naming it.

        Raises:
            SchemaError: If a part of it is missing or of the wrong type.
        """
        where = f"Question {name!r}"
        if self.kind not in KINDS:
            raise SchemaError(f"{where}: expected a kind in {list(KINDS)}, but got {self.kind!r}.")
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise SchemaError(f"{where}: expected instructions as non-empty text, but got {self.instructions!r}.")
        for i, text in enumerate(self.descriptions):
            if text is not None and not isinstance(text, str):
                raise SchemaError(f"{where}: expected description {i} to be text or None, but got {text!r}.")
        if self.kind == "yes_no" and (self.labels or len(self.descriptions) != 2):
            raise SchemaError(f"{where}: expected a yes/no question to have no labels and two meanings (yes, no).")
        if self.kind == "choice":
            if not self.labels or len(self.descriptions) != len(self.labels):
                raise SchemaError(
                    f"{where}: expected at least one label, each with a description or None, but got "
                    f"{len(self.labels)} labels and {len(self.descriptions)} descriptions."
                )
            bad = next((v for v in self.labels if not isinstance(v, (str, bool))), None)
            if bad is not None:
                raise SchemaError(f"{where}: expected every label to be a string or a boolean, but got {bad!r}.")
        if self.kind == "score":
            if self.labels or len(self.descriptions) < 2 or any(d is None for d in self.descriptions):
                raise SchemaError(
                    f"{where}: expected at least two levels, each described, but got {list(self.descriptions)}."
                )

    def field_schema(self) -> dict[str, Any]:
        """The question as a JSON Schema property: its values, and a description that says what each means."""
        described = [(v, d) for v, d in zip(self.values, self.descriptions, strict=False) if d and d.strip()]
        meanings = "; ".join(f"{json.dumps(v, ensure_ascii=False)} means: {d.strip()}" for v, d in described)
        if self.kind == "score" and meanings:
            meanings = "The levels, lowest first: " + meanings
        text = self.instructions.strip() + (f" ({meanings})" if meanings else "")
        if self.kind == "yes_no":
            return {"type": "boolean", "description": text}
        return {"enum": list(self.values), "description": text}


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
    def yes(self) -> float | None:
        """A yes/no question's probability of yes; ``None`` for the other kinds."""
        return self.probabilities[True] if self.kind == "yes_no" else None

    @property
    def score(self) -> float | None:
        """A score question's expected level (``sum(level * p)``); ``None`` for the other kinds."""
        if self.kind != "score":
            return None
        return sum(i * p for i, p in enumerate(self.probabilities.values()))  # the levels are 0 .. n-1, in order


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


def content_text(content: Any, *, where: str) -> str:
    """Instructions or a description given as text or JSON, as text: text as it is, other JSON as JSON text.

    Raises:
        ContextError: If it holds media, or is not JSON.
    """
    if isinstance(content, str):
        return content
    parts = _text_parts(content)
    if parts is not None:
        return "".join(parts)
    return json.dumps(_plain(content, where), ensure_ascii=False)


def state_text(state: Any, *, where: str = "state") -> str:
    """The text a state is decided on.

    Text is itself. A conversation (one OpenAI-style message ``{"role", "content"}``, or a list of them) is a
    transcript: each turn's text after its role (``User:``, ``Assistant:``, ``System:``), an assistant's tool calls
    as ``Called name({...})`` and a tool's result as ``Tool result (name): ...``, turns apart by blank lines. Any
    other JSON object or array is its JSON, indented, messages nested in it included.

    Raises:
        ContextError: If the state is a bare number, boolean or null, holds media, or is not JSON.
    """
    if isinstance(state, str):
        return state
    if _is_message(state):
        state = [state]
    if isinstance(state, list) and state and all(_is_message(m) for m in state):
        names = {c.get("id"): c.get("function", {}).get("name") for m in state for c in m.get("tool_calls") or []}
        turns = [_turn(m, names, f"{where}[{i}]") for i, m in enumerate(state)]
        return "\n\n".join(t for t in turns if t)
    if not isinstance(state, (dict, list)):
        raise ContextError(
            f"Context: expected {where} to be text, a JSON object or array, or messages, but got "
            f"{type(state).__name__} {state!r}."
        )
    return json.dumps(_plain(state, where), ensure_ascii=False, indent=2)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") in ROLES and "content" in value


def _turn(message: dict[str, Any], names: Mapping[Any, Any], where: str) -> str:
    """One message of a conversation as the transcript shows it."""
    content = message.get("content")
    text = "" if content is None else content_text(content, where=f"{where}.content").strip()
    if message["role"] == "tool":
        name = message.get("name") or names.get(message.get("tool_call_id")) or message.get("tool_call_id") or "tool"
        return tool_result_text(str(name), text)
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            parsed = {"arguments": arguments}
        calls.append((str(function.get("name")), parsed if isinstance(parsed, Mapping) else {"arguments": parsed}))
    body = "\n".join(t for t in (text, called_text(calls)) if t)
    return f"{ROLES[message['role']]}: {body}" if body else ""


def _text_parts(content: Any) -> list[str] | None:
    """A list of content parts that are all text (or JSON data), as texts; ``None`` when it is not such a list."""
    if not isinstance(content, list) or not content:
        return None
    out = []
    for part in content:
        if not isinstance(part, dict):
            return None
        if part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") == "input_json" and "data" in part:
            out.append(json.dumps(part["data"], ensure_ascii=False))
        elif part.get("type") in MEDIA:
            raise ContextError(f"Context: {_media(part)}")
        else:
            return None
    return out


def _plain(value: Any, where: str) -> Any:
    """``value`` checked to be JSON without media blocks."""
    if isinstance(value, dict):
        if value.get("type") in MEDIA:
            raise ContextError(f"Context: {where}: {_media(value)}")
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ContextError(f"Context: expected {where} to be JSON, but got {type(value).__name__}.")


def _media(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    return f"expected text, but got media (a {kind!r} block); pcd reads text only: no images, audio or files."
