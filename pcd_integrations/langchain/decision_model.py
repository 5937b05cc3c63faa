"""The LangChain decision model on pcd's engine: :class:`PCDDecisionModel` (see :mod:`pcd_integrations.langchain`).

LangChain's questions map to the engine's (:class:`pcd_engine.Question`): ``Noul`` to yes/no, its criteria the
meanings of yes and no; ``Choice`` to one label of ``criteria``'s keys, described by their values; ``Score`` to the
levels ``0 .. n-1`` of ``criteria``. Every question of a request is one closed field of one schema, so a request is
decided as one extraction (:func:`pcd_engine.decide_questions`). ``Box`` questions and media are refused.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.decisions import BaseDecisionModel, Box, Choice, ClassifierResponse, Noul, Score
from langchain_core.exceptions import ModelRefusalError
from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.runnables import RunnableConfig
from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from pcd_engine import (
    DEFAULT_MODEL,
    Decisions,
    Engine,
    ExtractOptions,
    Head,
    Question,
    QuestionError,
    SchemaError,
    content_text,
    decide_questions,
    questions_schema,
    read_decisions,
    state_text,
    surface_options,
)
from pcd_engine.adapters import check_text
from pcd_integrations._shared import own_error, read_settings, shared_engine

__all__ = ["PCDDecisionModel", "engine_questions"]


def engine_questions(questions: Mapping[str, Any]) -> dict[str, Question]:
    """LangChain's questions as the engine's, by id.

    Raises:
        SchemaError: For a ``Box`` question, media in instructions or criteria, or a question of no known type.
    """
    out = {}
    for name, question in questions.items():
        where = f"Question {name!r}"
        try:
            instructions = content_text(getattr(question, "instructions", None), where=f"{where} instructions")
            if isinstance(question, Noul):
                criteria = question.criteria
                yes, no = (None, None) if criteria is None else (criteria.true, criteria.false)
                out[name] = Question.yes_no(instructions, yes=_text(yes, where), no=_text(no, where))
            elif isinstance(question, Choice):
                labels = {label: _text(about, where) for label, about in question.criteria.items()}
                out[name] = Question.choice(instructions, labels)
            elif isinstance(question, Score):
                out[name] = Question.score(instructions, [content_text(c, where=where) for c in question.criteria])
            elif isinstance(question, Box):
                raise SchemaError(f"{where}: a Box question locates something in an image; pcd reads text only.")
            else:
                raise SchemaError(f"{where}: expected a Noul, Choice or Score, but got {type(question).__name__}.")
        except SchemaError:
            raise
        except ValueError as exc:  # media, from content_text
            raise SchemaError(f"{where}: {exc}") from None
    return out


def _text(value: Any, where: str) -> str | None:
    return None if value is None else content_text(value, where=where)


def plain_state(state: Any) -> Any:
    """A state with its LangChain messages, at any depth, as OpenAI-style message objects."""
    if isinstance(state, BaseMessage):
        return convert_to_openai_messages(state)
    if isinstance(state, Mapping):
        return {k: plain_state(v) for k, v in state.items()}
    if isinstance(state, Sequence) and not isinstance(state, (str, bytes, bytearray)):
        return [plain_state(v) for v in state]
    return state


def _answer(answer: Any, question: Any) -> dict[str, Any]:
    """One engine answer in LangChain's answer shape (a score's legend: its criteria)."""
    return answer.wire("langchain", legend=getattr(question, "criteria", None) or ())  # type: ignore[no-any-return]


class PCDDecisionModel(BaseDecisionModel):
    """A local decision model: every question of a request decided by pcd's engine in one pass per wave.

    Build it from a model name (an alias, a local folder or a repo id; the embedded SmolLM2-135M-Instruct by
    default) or from a loaded :class:`~pcd_engine.Engine`; models of the same name share one engine with
    :class:`~pcd_integrations.langchain.ChatPCD`.

    Answers: a ``Noul``'s ``noul`` is the probability of yes; a ``Choice``'s ``choice`` is the most probable label,
    with every label's probability; a ``Score``'s ``score`` is the expected level. ``confidence`` is how
    concentrated the distribution is, ``1 - H(p) / log(K)`` (1: all the mass on one label; 0: even), not the chosen
    label's probability. ``usage`` counts the prompt's tokens; nothing is generated.

    Abstaining: where a question's answer is below ``min_probability`` (in ``options``) or the head's threshold
    (:meth:`~pcd_engine.Head.with_thresholds`), ``invoke`` raises LangChain's ``ModelRefusalError`` naming the
    questions and the other answers are discarded, as ``OpenAIClassifier`` does when the Decisions API refuses;
    :meth:`decide` returns every answer with ``abstained`` marked, for a caller that wants them anyway.

    Example:
        >>> from langchain_core.decisions import Choice, Noul
        >>> model = PCDDecisionModel()
        >>> model.invoke({"state": "Refund me now!", "questions": {
        ...     "refund": Noul(instructions="Does the customer ask for money back?")}})  # doctest: +SKIP
    """

    model: str = DEFAULT_MODEL
    """Alias, folder or repo id; the embedded default model unless given."""
    backend: str = "auto"
    """``"auto"``, ``"torch"`` or ``"mlx"``."""
    engine: Any = Field(default=None, exclude=True)
    """A loaded engine to use instead of loading ``model``."""
    temperature: float | None = None
    """Reshapes the reported probabilities (the decisions never change); ``None`` or 1 for the model's own."""
    timeout: float | None = None
    """Seconds one request may take; it stops at the next pass boundary with :class:`~pcd_engine.RequestTimeout`."""
    calibration: dict[str, Any] | None = None
    """A :class:`~pcd_engine.Calibrator` (its JSON or its file) fitted on :func:`pcd_engine.questions_schema` of
    these questions; applied to every request with those questions."""
    head: dict[str, Any] | None = None
    """A :class:`~pcd_engine.Head` (its JSON or its file) fitted on :func:`pcd_engine.questions_schema` of these
    questions; it decides the questions it has a head for."""
    options: dict[str, Any] | None = None
    """Extraction options for every request (:class:`~pcd_engine.ExtractOptions` names: ``correction``,
    ``strategy``, ...). An unknown name is an :class:`~pcd_engine.OptionError`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _shared: Any = PrivateAttr(default=None)

    @property
    def _provider(self) -> str:
        return "pcd"

    @model_validator(mode="before")
    @classmethod
    def _settings(cls, data: Any) -> Any:
        """``model_name`` is another name for ``model``; an unknown argument is refused (pcd has no such setting)."""
        if not isinstance(data, dict):
            return data
        return read_settings("PCDDecisionModel", data, cls.model_fields, others="refuse")

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:  # a setting pcd refused: its own typed error, not pydantic's wrapper
            raise own_error(exc) from None
        self.call_options()  # a bad option or setting fails here, as an OptionError

    def get_engine(self) -> Engine:
        """The engine, loaded on first use (shared with every adapter of the same model and backend)."""
        if self.engine is None:
            self.engine = shared_engine(self.model, self.backend)
        return self.engine

    def call_options(self) -> ExtractOptions:
        """The options every request runs with: ``options`` over the model's settings."""
        return surface_options(
            ("PCDDecisionModel options", self.options), temperature=self.temperature, timeout=self.timeout,
            calibration=self.calibration, head=self.head,
        )  # fmt: skip

    def fit(
        self, questions: Mapping[str, Any], examples: Sequence[tuple[Any, Mapping[str, Any]]], **kwargs: Any
    ) -> Head:
        """Fit a decision head for ``questions`` from labelled states, with this model's options (its own head
        aside), gated as :meth:`pcd_engine.Head.fit` gates it; serve it with ``PCDDecisionModel(head=head)``, or
        save it for ``pcd serve --head NAME=FILE``.

        Args:
            questions: LangChain's questions by id (``Noul``, ``Choice``, ``Score``), as requests will ask them.
            examples: ``(state, {id: expected answer})`` pairs: a ``Choice``'s label, a ``Noul``'s ``True`` /
                ``False`` (or 1 / 0, ``"yes"`` / ``"no"``), a ``Score``'s level (0 .. n-1) or its criterion; a
                question an example leaves out is not used for it.
            **kwargs: :meth:`pcd_engine.Head.fit`'s options (``c``, ``require_better``, ``progress``, ``seed``).

        Returns:
            The head, with its gates (:attr:`pcd_engine.Head.gates`).

        Raises:
            SchemaError: For a question pcd cannot ask.
            QuestionError: For an expected answer its question cannot give (naming the example and question).
            ContextError: For a state that cannot be read.
            OptionError: As :meth:`pcd_engine.Head.fit` raises it.
        """
        asked = engine_questions(questions)
        labelled = []
        for i, (state, expected) in enumerate(examples):
            answers = {}
            for name, raw in expected.items():
                if name not in asked:
                    raise QuestionError(f"examples[{i}].{name}: expected a question of {list(asked)}.",
                                        param=f"examples[{i}].{name}")  # fmt: skip
                answers[name] = asked[name].type.expected(asked[name], raw, f"examples[{i}].{name}")
            labelled.append((_state_text(state), answers))
        options = surface_options(("PCDDecisionModel options", self.options), temperature=self.temperature,
                                  calibration=self.calibration)  # fmt: skip
        return Head.fit(self.get_engine(), questions_schema(asked), labelled, options=options, **kwargs)

    def decide(self, states: Sequence[Any], questions: Mapping[str, Any]) -> list[Decisions | Exception]:
        """The engine's :class:`~pcd_engine.Decisions` (answers with their evidence) for every state, in ONE
        engine call; a state that cannot be read gets its error in its place."""
        asked = engine_questions(questions)
        texts: list[Any] = []
        for state in states:
            try:
                texts.append(_state_text(state))
            except (ValueError, TypeError) as exc:  # no text, media, not JSON: this state fails alone
                texts.append(exc)
        readable = [t for t in texts if not isinstance(t, Exception)]
        decided = iter(
            decide_questions(self.get_engine(), readable, asked, options=self.call_options(), return_exceptions=True)
        )
        return [t if isinstance(t, Exception) else next(decided) for t in texts]

    def _classify(self, state: Any, questions: dict[str, Any]) -> ClassifierResponse:
        shared: _SharedBatch | None = self._shared
        decided = shared.answer(state, questions) if shared is not None else self.decide([state], questions)[0]
        if isinstance(decided, Exception):
            raise decided
        return self._response(decided, questions)

    async def _aclassify(self, state: Any, questions: dict[str, Any]) -> ClassifierResponse:
        """As :meth:`_classify`, through the engine's shared collector: concurrent ``ainvoke`` calls
        (``asyncio.gather``) are decided in shared batches, one pass per wave for all of them."""
        import asyncio

        asked = engine_questions(questions)
        text = _state_text(state)
        engine = self.get_engine()
        future = engine.collector().submit(text, questions_schema(asked), self.call_options())
        return self._response(read_decisions(await asyncio.wrap_future(future), asked), questions)

    def _response(self, decided: Decisions, questions: Mapping[str, Any]) -> ClassifierResponse:
        refused = [name for name in questions if decided.answers[name].abstained]
        if refused:  # as OpenAIClassifier does with the wire's refusals: the other answers are discarded
            raise ModelRefusalError(f"pcd abstained on: {', '.join(refused)} (the probability of its answer was below "
                                    "min_probability or the head's threshold).")  # fmt: skip
        answers = {name: _answer(decided.answers[name], q) for name, q in questions.items()}
        usage = decided.usage.input_output()
        return ClassifierResponse.model_validate({"model": self.model, "answers": answers, "usage": usage})

    def batch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Every request decided in ONE engine call per distinct set of questions (one pass per wave for all the
        states that share it), with the Runnable semantics of any batch: each input runs with its own config, the
        engine call happens inside the runs, and an input that fails fails alone."""
        if not inputs:
            return []
        bound = self.model_copy()
        bound._shared = _SharedBatch(self, inputs)
        return super(PCDDecisionModel, bound).batch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    async def abatch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """As :meth:`batch`, in a worker thread so the event loop stays free."""
        from langchain_core.runnables.config import run_in_executor

        return await run_in_executor(
            None, lambda: self.batch(inputs, config, return_exceptions=return_exceptions, **kwargs)
        )


class _SharedBatch:
    """The answers of one batch, decided on the first run that asks (the others wait for it): one engine call per
    distinct set of questions. Each run then finds its answer by its state's text and its questions."""

    def __init__(self, model: PCDDecisionModel, inputs: Sequence[Any]) -> None:
        self._model, self._inputs = model, inputs
        self._answers: dict[Any, Decisions | Exception] | None = None
        self._lock = threading.Lock()

    def answer(self, state: Any, questions: Mapping[str, Any]) -> Decisions | Exception:
        with self._lock:
            if self._answers is None:
                self._answers = self._decide_all()
        key = _key(state, questions)
        hit = None if key is None else self._answers.get(key)
        return hit if hit is not None else self._model.decide([state], questions)[0]

    def _decide_all(self) -> dict[Any, Decisions | Exception]:
        groups: dict[Any, list[Any]] = {}  # the readable requests by their questions, keyed as answer() looks up
        for request in self._inputs:
            key = _key(request.get("state"), request.get("questions") or {}) if isinstance(request, Mapping) else None
            if key is not None:
                groups.setdefault(key[1], []).append(key)
        model = self._model
        out: dict[Any, Decisions | Exception] = {}
        for asked, keys in groups.items():
            decided = decide_questions(model.get_engine(), [text for text, _ in keys], dict(asked),
                                       options=model.call_options(), return_exceptions=True)  # fmt: skip
            out.update(zip(keys, decided, strict=True))
        return out


def _state_text(state: Any) -> str:
    """The text a state is decided on (:func:`pcd_engine.state_text`, LangChain messages read as OpenAI-style
    ones), checked to hold some.

    Raises:
        ContextError: If it holds media or no text, or is not JSON.
    """
    return check_text(state_text(plain_state(state)), where="state")


def _key(state: Any, questions: Mapping[str, Any]) -> Any:
    """``(state text, questions)`` identifying a request in a batch; ``None`` for one that cannot be read (it is
    decided alone, and fails alone)."""
    try:
        return _state_text(state), tuple(engine_questions(questions).items())
    except (ValueError, TypeError):
        return None
