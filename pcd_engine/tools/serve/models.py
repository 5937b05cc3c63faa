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

__all__ = ["BaselineRequest", "ChatCompletionRequest", "ExtractRequest", "parse_body"]

M = TypeVar("M", bound=BaseModel)


class ExtractRequest(BaseModel):
    """``POST /api/extract`` and ``POST /api/baseline``.

    Attributes:
        schema_: The JSON Schema or preset dict (``schema`` in the body).
        context: The document.
        options: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(populate_by_name=True)

    schema_: dict[str, Any] = Field(alias="schema", description="a JSON Schema or preset dict")
    context: str = Field(description="the document")
    options: dict[str, Any] = Field(default_factory=dict)

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


class BaselineRequest(ExtractRequest):
    """``POST /api/baseline``: as :class:`ExtractRequest`; ``options.max_new_tokens`` caps the answer."""


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: the fields pcd reads (others are accepted as OpenAI clients send them).

    Attributes:
        model: The model id; it must be the served one.
        messages: The conversation (checked message by message, for messages that name the index).
        response_format: ``{"type": "json_schema", ...}`` or ``{"type": "text"}``.
        stream: Answer as Server-Sent Events.
        temperature: Reshapes the reported probabilities when positive.
        max_tokens: Token limit (per generated value for a schema; of the reply for free text).
        max_completion_tokens: The newer name of ``max_tokens``; it wins.
        stop: Stop strings for free text.
        pcd: pcd options (see :class:`~pcd_engine.options.ExtractOptions`).
    """

    model_config = ConfigDict(extra="allow")

    model: Any = None
    messages: Any = None
    response_format: Any = None
    stream: bool = False
    temperature: Any = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    stop: str | list[str] | None = None
    pcd: dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


_EXPECTED = {
    "schema": "a 'schema' (JSON Schema or preset dict)",
    "context": "'context' to be a non-empty string",
    "options": "'options' to be an object",
    "max_tokens": "a positive integer",
    "max_completion_tokens": "a positive integer",
    "stop": "a string or a list of strings",
    "pcd": "an object of pcd options",
    "stream": "true or false",
}


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
