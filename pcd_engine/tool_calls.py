"""Tool calls as decisions: which tool to call (or whether to answer instead) is a closed field pcd scores, and
the chosen tool's arguments are a schema pcd fills.

A chat model that writes a tool call token by token can write a malformed call, a tool that does not exist, or
arguments its schema refuses. Here the choice is one closed question over the tool names (plus ``"answer"`` when
the choice is ``"auto"``), decided from the conversation in one tree-packed pass with a probability for every
option; with ``parallel=True`` it is a multi-label question (each tool called or not). Each chosen tool's
arguments are then filled as its own schema (closed arguments scored, open ones generated under their JSON
Schema), so every call names a real tool and its arguments always validate.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from pcd_engine.deciders.corrections import lean_favours_others
from pcd_engine.errors import OptionError
from pcd_engine.options import ExtractOptions
from pcd_engine.result import Alternative, ExtractionResult, FieldResult

if TYPE_CHECKING:
    from pcd_engine.engine import Engine

__all__ = [
    "ANSWER",
    "Tool",
    "ToolCall",
    "ToolDecision",
    "call_id",
    "as_read",
    "choice_of",
    "choice_schema",
    "decide_tools",
    "leans_to_calling",
]

ANSWER = "answer"
"""The option that means "call no tool, answer the user" under ``choice="auto"``."""

Choice = Literal["auto", "required", "none"] | str


@dataclass(frozen=True)
class Tool:
    """A tool the model may call.

    Attributes:
        name: The tool's name.
        description: What it does, shown to the model.
        parameters: Its arguments as a JSON Schema object (``{"type": "object", "properties": {...}}``); no
            properties means the tool takes no arguments.
    """

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """One decided call.

    Attributes:
        name: The tool.
        arguments: Its arguments; they validate against the tool's parameters.
        result: The extraction that filled them (``None`` for a tool without arguments).
        id: The call's id, ``call_`` and 24 hex digits (:func:`call_id`), the one every surface replies with; not
            part of the call's equality.
    """

    name: str
    arguments: dict[str, Any]
    result: ExtractionResult | None
    id: str = field(default_factory=lambda: call_id(), compare=False)


def call_id() -> str:
    """A new tool call id, as OpenAI writes them: ``call_`` and 24 random hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolDecision:
    """What the model decided to do next.

    Attributes:
        calls: The tools to call, in the order given; empty when the model answers instead.
        choice: The evidence of the choice: the field ``"next"`` (one option) or ``"tools"`` (parallel), with the
            probability of every option; ``None`` when nothing was left to decide (``"none"``, or one forced tool).
        passed_over: Tools the choice preferred whose call, with the same arguments, was already made and answered
            in the conversation (:func:`decide_tools`' ``done``): the decision went to the next option instead.
    """

    calls: tuple[ToolCall, ...]
    choice: FieldResult | None
    passed_over: tuple[str, ...] = ()

    @property
    def answer(self) -> bool:
        """True when no tool is called."""
        return not self.calls

    def evidence(self) -> dict[str, Any]:
        """The decision as JSON-ready data: the choice's value, probability and alternatives (``None`` when nothing
        was decided), and each call's argument fields with their evidence (see
        :meth:`~pcd_engine.ExtractionResult.evidence`)."""
        choice = self.choice
        chosen = None
        if choice is not None:
            chosen = {
                "value": choice.value,
                "probability": choice.probability,
                "alternatives": [[a.value, a.probability] for a in choice.alternatives],
            }
        arguments = {call.name: call.result.evidence() for call in self.calls if call.result is not None}
        out: dict[str, Any] = {"tool_choice": chosen, "arguments": arguments}
        if self.passed_over:
            out["passed_over"] = list(self.passed_over)
        return out


def choice_of(tool_choice: object, names: Sequence[str]) -> str:
    """A framework's ``tool_choice`` as pcd's choice: ``"auto"``, ``"required"``, ``"none"`` or a tool's name.

    Args:
        tool_choice: ``None`` / ``"auto"`` (a tool, or answer), ``"any"`` / ``"required"`` / ``True`` (some tool),
            ``"none"`` / ``False`` (answer), a tool's name, or an OpenAI-style ``{"function": {"name": ...}}`` /
            ``{"name": ...}``.
        names: The tools' names.

    Raises:
        OptionError: If the choice names no given tool.
    """
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        choice = str((function.get("name") if isinstance(function, Mapping) else None) or tool_choice.get("name"))
    elif tool_choice is True or tool_choice in ("any", "required"):
        choice = "required"
    elif tool_choice is None or tool_choice == "auto":
        choice = "auto"
    elif tool_choice is False or tool_choice == "none":
        choice = "none"
    else:
        choice = str(tool_choice)
    if choice not in ("auto", "required", "none") and choice not in names:
        raise OptionError(
            f"tool_choice: expected 'auto', 'required', 'none' or one of {list(names)}, but got {tool_choice!r}."
        )
    return choice


def choice_schema(tools: Sequence[Tool], *, choice: Choice = "auto", parallel: bool = False) -> dict[str, Any]:
    """The closed question that decides which tool to call, as a JSON Schema.

    Args:
        tools: The tools, in order.
        choice: ``"auto"`` (a tool or ``"answer"``), ``"required"`` (some tool), or a tool's name.
        parallel: Several tools may be called (a multi-label question) instead of one.

    Raises:
        OptionError: If there are no tools, names repeat, or the choice is unknown.
    """
    names = [t.name for t in tools]
    if not names or len(set(names)) != len(names):
        raise OptionError(f"Tools: expected at least one tool and distinct names, but got {names}.")
    if choice not in ("auto", "required"):
        raise OptionError(f"tool_choice: expected 'auto', 'required', 'none' or a tool name, but got {choice!r}.")
    listing = "; ".join(f"{t.name}: {(t.description or 'no description').strip()}" for t in tools)
    options = [*names, ANSWER] if choice == "auto" and not parallel else names
    if parallel:
        question: dict[str, Any] = {
            "type": "array",
            "items": {"enum": options},
            "uniqueItems": True,
            "minItems": 1 if choice == "required" else 0,
            "description": f"The tools to call now, none to answer the user directly. Tools: {listing}",
        }
        key = "tools"
    else:
        extra = (
            f", or {ANSWER!r} to answer the user directly. Call a tool only to get what the conversation does not "
            f"have yet; once a tool result answers the user, {ANSWER!r}"
            if choice == "auto"
            else ""
        )
        question = {"enum": options, "description": f"The tool to call next{extra}. Tools: {listing}"}
        key = "next"
    return {
        "title": "Next step",
        "description": "Decide what to do next in this conversation: call a tool, or answer.",
        "type": "object",
        "properties": {key: question},
        "required": [key],
    }


def decide_tools(
    engine: Engine,
    text: str,
    tools: Sequence[Tool],
    *,
    choice: Choice = "auto",
    parallel: bool = False,
    options: ExtractOptions | Mapping[str, Any] | None = None,
    done: Sequence[tuple[str, Mapping[str, Any]]] = (),
    **extract: Any,
) -> ToolDecision:
    """Decide which tools to call on ``text`` (the conversation so far), then fill each call's arguments.

    A call is never repeated: a chosen tool whose arguments come out as those of a call in ``done`` (already made,
    its result in the conversation) is passed over for the next most probable option (under ``"auto"``, answering
    counts as one), so an agent loop moves on instead of asking the same thing again. Under ``"required"`` a call
    is made even when every tool would repeat one (the most probable).

    Args:
        engine: The engine.
        text: The conversation as one document (tool results included).
        tools: The tools.
        choice: ``"auto"``, ``"required"`` (``"any"`` is accepted too), ``"none"``, or a tool's name (forced).
        parallel: Let the model call several tools at once.
        options: Extraction options for every call. The choice of tool is a closed field like any other, with
            one difference under the engine's default correction (:func:`leans_to_calling`): the model's
            content-free lean is divided out of the choice only when, asked nothing, the model would call a tool
            (a tiny model calls the first tool listed even on a greeting); a model that would answer there keeps
            its own choice, since answering is the right reply to a content-free turn, not a lean. A
            ``correction`` (or calibration, or head) named in the options decides as named.
        done: The calls already made whose results are in the conversation, as ``(name, arguments)``.
        **extract: Passed to every :meth:`~pcd_engine.Engine.extract` call (``limits``, ``cancelled``).

    Returns:
        The calls (none when the model answers) and the evidence of the choice.

    Raises:
        OptionError: On an unknown choice or tool name, or no tools.
        SchemaError: If a tool's parameters cannot be filled.
    """
    by_name = {t.name: t for t in tools}
    choice = "required" if choice == "any" else choice
    if choice == "none":
        return ToolDecision((), None)
    if choice not in ("auto", "required"):
        if choice not in by_name:
            raise OptionError(f"tool_choice: expected one of {list(by_name)}, but got {choice!r}.")
        return ToolDecision((_call(engine, text, by_name[choice], options, extract),), None)
    if choice == "required" and len(tools) == 1 and not parallel:
        return ToolDecision((_call(engine, text, tools[0], options, extract),), None)
    question = choice_schema(tools, choice=choice, parallel=parallel)
    decided = engine.extract(text, question, options, **extract)
    evidence = decided.fields["tools" if parallel else "next"]
    made = {_call_key(name, arguments) for name, arguments in done}
    if parallel:
        calls = [_call(engine, text, t, options, extract) for t in tools if t.name in list(evidence.value)]
        fresh = tuple(c for c in calls if _call_key(c.name, c.arguments) not in made)
        if not fresh and calls and choice == "required":
            fresh = (calls[0],)
        return ToolDecision(fresh, evidence, tuple(c.name for c in calls if c not in fresh))
    labels = list(question["properties"]["next"]["enum"])
    if choice == "auto" and not _names_correction(options, extract) and not leans_to_calling(evidence, labels):
        evidence = as_read(evidence, labels)
    probabilities = evidence.label_distribution or tuple(1.0 if v == evidence.value else 0.0 for v in labels)
    ranked = [v for _, v in sorted(zip(probabilities, labels, strict=True), key=lambda pv: -pv[0])]
    ranked.remove(evidence.value)
    passed: list[ToolCall] = []
    for option in [evidence.value, *ranked]:
        if option == ANSWER:
            return ToolDecision((), evidence, tuple(c.name for c in passed))
        call = _call(engine, text, by_name[str(option)], options, extract)
        if _call_key(call.name, call.arguments) not in made:
            return ToolDecision((call,), evidence, tuple(c.name for c in passed))
        passed.append(call)
    return ToolDecision((passed[0],), evidence)  # "required", and every tool would repeat a call: the likeliest


def leans_to_calling(evidence: FieldResult, labels: Sequence[Any]) -> bool:
    """Whether the lean a content-free correction divided out of a tool choice would call a tool: the model, asked
    nothing (:data:`~pcd_engine.deciders.corrections.CONTENT_FREE_TEXTS`), puts more probability on some tool
    than on answering. Only then is the lean a defect: answering is the right reply to a turn that says nothing,
    so a model that answers there has shown no lean towards calling, and dividing its reading out would push every
    turn towards a tool call. True for any other correction (a calibration or a batch's lean is the user's
    choice), and False where nothing was corrected.
    """
    return lean_favours_others(evidence.correction, evidence.lean, list(labels).index(ANSWER))


def as_read(evidence: FieldResult, labels: Sequence[Any]) -> FieldResult:
    """``evidence`` decided by the model's own distribution (its ``raw_distribution``) instead of the corrected
    one: the argmax (the first label on a tie), its probability and the alternatives as read, no correction."""
    if evidence.raw_distribution is None:
        return evidence
    raw = evidence.raw_distribution
    order = sorted(range(len(raw)), key=lambda i: (-raw[i], i))
    return replace(
        evidence, value=labels[order[0]], probability=raw[order[0]], label_distribution=tuple(raw),
        alternatives=tuple(Alternative(labels[i], raw[i]) for i in order[: len(evidence.alternatives)]),
        raw_probability=None, raw_distribution=None, correction=None, lean=None,
    )  # fmt: skip


def _names_correction(options: ExtractOptions | Mapping[str, Any] | None, knobs: Mapping[str, Any]) -> bool:
    """Whether the call names how its fields are decided, in its options or as a keyword
    (:attr:`~pcd_engine.options.ExtractOptions.names_decider`)."""
    known = {f.name for f in fields(ExtractOptions)}
    given = ExtractOptions.parse(options)
    keyed = ExtractOptions.parse({k: v for k, v in knobs.items() if k in known and v is not None})
    return given.names_decider or keyed.names_decider


def _call_key(name: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
    """A call's identity: its tool and its arguments (as canonical JSON)."""
    return name, json.dumps(dict(arguments), sort_keys=True, ensure_ascii=False, default=str)


def _call(
    engine: Engine,
    text: str,
    tool: Tool,
    options: ExtractOptions | Mapping[str, Any] | None,
    extract: Mapping[str, Any],
) -> ToolCall:
    """Fill one tool's arguments from the conversation."""
    if not tool.parameters.get("properties"):
        return ToolCall(tool.name, {}, None)
    schema = {"title": tool.name, **dict(tool.parameters)}
    if tool.description and "description" not in schema:
        schema["description"] = tool.description
    result = engine.extract(text, schema, options, **extract)
    return ToolCall(tool.name, dict(result.values), result)
