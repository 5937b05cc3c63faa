"""The request bodies, as Pydantic models: what each endpoint reads, with its types checked in one place.

The body is read and size-checked first (:meth:`~pcd_engine.tools.serve.app.Server.read_json`), then validated
here by :func:`parse_body`, which turns Pydantic's first error into an :class:`~pcd_engine.tools.serve.errors.
HTTPError` naming the field. Fields that take pcd options (``options``, ``pcd``) are checked by
:meth:`~pcd_engine.options.ExtractOptions.parse`, so an unknown option gets the same message on every surface.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from pcd_engine.tools.serve.errors import HTTPError

__all__ = [
    "BaselineRequest",
    "ChatCompletionRequest",
    "CompletionRequest",
    "DecisionsRequest",
    "ExtractRequest",
    "ResponsesRequest",
    "SystemOneRequest",
    "documented",
    "parse_body",
    "refused_extra",
]

M = TypeVar("M", bound=BaseModel)


class ExtractRequest(BaseModel):
    """``POST /api/extract`` and ``POST /api/baseline``.

    Attributes:
        schema_: The JSON Schema or preset dict (``schema`` in the body).
        context: The document.
        options: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
        model: A fitted head's served name (``pcd serve --head NAME=...``) to decide with; ``None``: the model.
    """

    model_config = ConfigDict(populate_by_name=True)

    schema_: dict[str, Any] = Field(alias="schema", description="a JSON Schema or preset dict")
    context: str = Field(description="the document")
    options: dict[str, Any] = Field(default_factory=dict)
    model: str | None = Field(default=None, description="a served head's name, or the model's")

    @field_validator("context")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("it holds only whitespace")
        return value

    @field_validator("options", mode="before")
    @classmethod
    def _null_options(cls, value: Any) -> Any:
        return {} if value is None else value


class OutcomeRequest(BaseModel):
    """``POST /api/outcomes``: what a logged answer should have been.

    Attributes:
        id: The id of a logged decision (``pcd serve --log``): ``/api/extract``'s ``id``, or any route's
            ``x-pcd-decision-id`` header (``pcd.decision_id`` in its body).
        values: The right values of some of its fields (for questions, answers by question name), by name.
    """

    id: str = Field(description="a logged decision's id (the x-pcd-decision-id header)")
    values: dict[str, Any] = Field(description="the right values of some fields, by name")

    @field_validator("values")
    @classmethod
    def _some(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            raise ValueError("it names no field")
        return value


class BaselineRequest(ExtractRequest):
    """``POST /api/baseline``: as :class:`ExtractRequest`; ``options.max_new_tokens`` caps the answer."""


class DecisionsRequest(BaseModel):
    """``POST /v1/decisions``.

    Attributes:
        model: The model id; any name in ``/v1/models``.
        input: A string, or input items: messages (text, ``input_json`` parts), ``function_call`` and
            ``function_call_output``.
        questions: ``{"type": "predicate" | "choice" | "score", "name", "instructions", "choices" | "levels"}``.
        pcd: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    input: str | list[dict[str, Any]]
    questions: list[dict[str, Any]] = Field(min_length=1)
    pcd: dict[str, Any] | None = None

    def refused(self) -> tuple[str, str] | None:
        """An unknown field, by name."""
        return refused_extra(self.model_extra or {}, ())


class SystemOneRequest(BaseModel):
    """``POST /v1/systemone``.

    Attributes:
        model: The model id; any name in ``/v1/models``.
        state: Text, a JSON object or a JSON array; messages (``{"role", "content"}``) at the root read as a
            conversation.
        questions: ``{id: {"type": "noul" | "choice" | "score", "instructions", "criteria"}}``.
        pcd: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    state: str | dict[str, Any] | list[Any]
    questions: dict[str, dict[str, Any]] = Field(min_length=1)
    pcd: dict[str, Any] | None = None

    def refused(self) -> tuple[str, str] | None:
        """An unknown field, by name."""
        return refused_extra(self.model_extra or {}, ())


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: every field OpenAI defines is either honoured or refused by name.

    Attributes:
        model: The model id; any name in ``/v1/models``.
        messages: The conversation (checked message by message, for messages that name the index): system,
            developer, user, assistant (with ``tool_calls``) and tool turns, text content only.
        response_format: ``{"type": "json_schema", ...}``, ``{"type": "json_object"}`` or ``{"type": "text"}``.
        tools: Function tools; which one to call is the engine's scored decision (see :mod:`pcd_engine.tool_calls`).
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or ``{"type": "function", "function": {"name": ...}}``.
        parallel_tool_calls: Let the model call several tools at once (each tool called or not); default true.
        stream: Answer as Server-Sent Events.
        stream_options: ``{"include_usage": true}`` sends a last chunk with the usage.
        temperature: Reshapes the reported probabilities when positive; free text is greedy.
        max_tokens: Token limit (per generated value for a schema; of the reply for free text).
        max_completion_tokens: The newer name of ``max_tokens``; it wins.
        stop: Stop strings for free text.
        n: How many choices; pcd's answer is deterministic, so only 1.
        seed: Accepted: greedy decoding gives the same answer for every seed.
        top_p: Accepted: the greedy token is inside every nucleus.
        user: An end-user id, accepted (pcd keeps no per-user state).
        logprobs: With a ``json_schema`` answer: each scored field's log-probability, as ``logprobs.content``
            entries whose token is ``field=value`` (tool calls: ``tool=name`` and ``name.argument=value``).
        top_logprobs: How many alternatives each entry lists (0 to 20).
        pcd: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    messages: Any = None
    response_format: Any = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: Any = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stop: str | list[str] | None = None
    n: StrictInt | None = None
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = None
    seed: int | None = None
    top_p: float | None = None
    user: str | None = None
    pcd: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        """Whether a streamed reply ends with a usage chunk."""
        return bool((self.stream_options or {}).get("include_usage"))

    def refused(self) -> tuple[str, str] | None:
        """The first field pcd cannot honour, with why: ``(field, message)``; ``None`` when every field is
        honoured. A field left at its neutral value (``n=1``, ``logprobs=false``, zero penalties, ...) is fine."""
        if self.n not in (None, 1):
            return "n", f"n: expected 1, but got {self.n}; pcd's answer is deterministic, so every choice is the same."
        schema = isinstance(self.response_format, dict) and self.response_format.get("type") == "json_schema"
        calls = bool(self.tools) and self.tool_choice not in (None, "auto", "none")
        if self.logprobs and not (schema or calls):
            return "logprobs", (
                "logprobs: pcd reports the log-probability of each scored field (a json_schema answer or a tool "
                "call that is required), not of free-text tokens; set response_format to a json_schema, require a "
                "tool, or drop logprobs."
            )
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            return "top_logprobs", f"top_logprobs: expected 0 to 20, but got {self.top_logprobs}."
        return refused_extra(self.model_extra or {}, _REFUSED)


class CompletionRequest(BaseModel):
    """``POST /v1/completions``, OpenAI's legacy text completion: the greedy continuation of a raw prompt.

    Attributes:
        model: The model id; any name in ``/v1/models``.
        prompt: The text to continue (one string, or a list holding one).
        max_tokens: Token limit of the continuation (OpenAI's default, 16, when unset).
        stream: Answer as Server-Sent Events.
        stream_options: ``{"include_usage": true}`` sends a last chunk with the usage.
        stop: Stop strings.
        temperature: Accepted; the continuation is greedy (see the README).
        n: Only 1.
        seed: Accepted: greedy decoding gives the same answer for every seed.
        top_p: Accepted: the greedy token is inside every nucleus.
        user: An end-user id, accepted.
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    prompt: str | list[str]
    max_tokens: StrictInt | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    n: StrictInt | None = None
    seed: int | None = None
    top_p: float | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        """Whether a streamed reply ends with a usage chunk."""
        return bool((self.stream_options or {}).get("include_usage"))

    def refused(self) -> tuple[str, str] | None:
        """As :meth:`ChatCompletionRequest.refused`, for the completion fields."""
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            return "prompt", f"prompt: expected a string or a list of one, but got a list of {len(self.prompt)}."
        if self.n not in (None, 1):
            return "n", f"n: expected 1, but got {self.n}; pcd's answer is deterministic, so every choice is the same."
        return refused_extra(self.model_extra or {}, _COMPLETION_REFUSED)


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``, OpenAI's Responses API: text, ``text.format`` (``json_schema``, ``json_object``)
    and function tools, answered as Chat Completions are.

    Attributes:
        model: The model id; any name in ``/v1/models``.
        input: A string (one user turn) or a list of items: messages (text parts only), ``function_call`` and
            ``function_call_output``.
        instructions: A system turn put first.
        text: ``{"format": {"type": "text" | "json_object" | "json_schema", ...}}``.
        tools: Function tools (``{"type": "function", "name": ..., "parameters": ...}``).
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or ``{"type": "function", "name": ...}``.
        parallel_tool_calls: Let the model call several tools at once; default true.
        max_output_tokens: Token limit (per generated value for a schema; of the reply for free text).
        temperature: Reshapes the reported probabilities when positive; free text is greedy.
        top_p: Accepted: the greedy token is inside every nucleus.
        stream: Answer as Server-Sent Events (the answer's events, sent once it is complete).
        store: Only false: pcd stores no responses.
        metadata: Echoed back.
        user: An end-user id, accepted.
        pcd: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    pcd: dict[str, Any] | None = None

    def refused(self) -> tuple[str, str] | None:
        """As :meth:`ChatCompletionRequest.refused`, for the Responses fields."""
        if self.store:
            return "store", "store: expected false; pcd stores no responses, so it cannot keep this one."
        return refused_extra(self.model_extra or {}, _RESPONSES_REFUSED)


_LOGPROBS = (
    ("logprobs", (None, False), "pcd returns per-field evidence in the 'pcd' field, not token logprobs"),
    ("top_logprobs", (None, 0), "pcd returns per-field evidence in the 'pcd' field, not token logprobs"),
)
# Fields pcd cannot honour beyond their neutral values: (name, neutral values, what pcd does instead).
_REFUSED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("presence_penalty", (None, 0, 0.0), "expected 0; pcd decodes greedily without penalties"),
    ("frequency_penalty", (None, 0, 0.0), "expected 0; pcd decodes greedily without penalties"),
    ("logit_bias", (None, {}), "expected none; pcd scores the allowed values as the model gives them"),
    ("modalities", (None, ["text"]), "expected ['text']; pcd answers in text"),
    ("audio", (None,), "expected none; pcd answers in text"),
    ("prediction", (None,), "expected none; pcd has no predicted-output decoding"),
    ("functions", (None,), "expected none; pass 'tools' instead of the legacy 'functions'"),
    ("function_call", (None,), "expected none; pass 'tool_choice' instead of the legacy 'function_call'"),
    ("web_search_options", (None,), "expected none; pcd runs a local model without web search"),
    ("reasoning_effort", (None,), "expected none; pcd has no reasoning mode"),
    ("store", (None, False), "expected false; pcd stores no completions"),
    ("verbosity", (None,), "expected none; the length of free text is set by max_tokens"),
)
_COMPLETION_REFUSED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    _LOGPROBS[0],
    *(entry for entry in _REFUSED if entry[0] in ("presence_penalty", "frequency_penalty", "logit_bias")),
    ("echo", (None, False), "expected false; the reply holds the continuation only"),
    ("suffix", (None, ""), "expected none; pcd does not fill in the middle"),
    ("best_of", (None, 1), "expected 1; pcd's answer is deterministic"),
)
_RESPONSES_REFUSED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("previous_response_id", (None,), "expected none; pcd stores no responses, so send the whole input"),
    ("conversation", (None,), "expected none; pcd stores no conversations, so send the whole input"),
    ("reasoning", (None, {}), "expected none; pcd has no reasoning mode"),
    ("include", (None, []), "expected none; pcd has no extra output to include"),
    ("background", (None, False), "expected false; pcd answers in the request"),
    ("prompt", (None,), "expected none; pcd has no stored prompt templates"),
    ("max_tool_calls", (None,), "expected none; the tool decision bounds the calls by the tools given"),
    ("top_logprobs", (None, 0), "pcd returns per-field evidence in the 'pcd' field, not token logprobs"),
    ("truncation", (None, "disabled"), "expected 'disabled'; a request that does not fit is refused"),
    ("stream_options", (None, {}), "expected none"),
)
# Fields that need nothing from pcd: identifiers and routing hints for hosted services.
_ACCEPTED = {"metadata", "service_tier", "safety_identifier", "prompt_cache_key"}


def refused_extra(
    extra: dict[str, Any], refused: tuple[tuple[str, tuple[Any, ...], str], ...]
) -> tuple[str, str] | None:
    """The first extra field that is refused at a non-neutral value, or unknown."""
    for name, neutral, why in refused:
        if name in extra and extra[name] not in neutral:
            return name, f"{name}: {why}, but got {extra[name]!r}."
    known = {name for name, _, _ in refused} | _ACCEPTED
    for name in extra:
        if name not in known:
            return name, f"{name}: not a field pcd knows for this route; remove it (pcd options go in 'pcd')."
    return None


_EXPECTED = {
    "schema": "a 'schema' (JSON Schema or preset dict)",
    "context": "'context' to be a non-empty string",
    "options": "'options' to be an object",
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "stop": "a string or a list of strings",
    "pcd": "an object of pcd options",
    "stream": "true or false",
    "tools": "a list of tool objects",
    "tool_choice": "'auto', 'required', 'none' or a named function",
    "parallel_tool_calls": "true or false",
    "stream_options": "an object",
    "n": "an integer",
    "prompt": "a string (or a list of one)",
    "input": "a string or a list of input items",
    "max_output_tokens": "a positive integer",
    "text": "an object with a 'format'",
}


def documented(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads ``model`` from its JSON body itself (to bound its size and time
    first): the body's schema, so that ``/docs`` documents it."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def parse_body(model: type[M], data: dict[str, Any], *, kinds: dict[str, str] | None = None) -> M:
    """Validate a JSON body against ``model``.

    Args:
        model: The request model.
        data: The parsed JSON object.
        kinds: Error kinds by field name (default ``invalid_request``).

    Raises:
        HTTPError: A 400 naming the first field at fault, what it expects and what Pydantic said.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "body"
        expected = _EXPECTED.get(name, f"a valid {name!r}")
        message = f"Request: expected {expected}, but {error['msg'][0].lower()}{error['msg'][1:]}."
        raise HTTPError(400, (kinds or {}).get(name, "invalid_request"), message, param=name) from None
