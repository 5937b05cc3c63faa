"""The OpenAI routes' two token limits: the client's (``max_tokens``, ``max_completion_tokens``,
``max_output_tokens``) caps the whole reply, and ``pcd.max_tokens`` (the engine's default when unnamed) caps each
generated value of a structured reply, never above the reply's."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="pip install 'pcd-llm[serve]'")

from pcd_engine import Engine  # noqa: E402
from pcd_engine.tools.serve import (  # noqa: E402
    create_app,  # noqa: E402
    openai_api,
    responses_api,
)
from pcd_engine.tools.serve.answers import extract_options, token_limit  # noqa: E402
from pcd_engine.tools.serve.errors import HTTPError  # noqa: E402
from pcd_engine.tools.serve.models import ChatCompletionRequest, ResponsesRequest  # noqa: E402
from tests.support import OracleBackend, OracleLM  # noqa: E402


@pytest.fixture(scope="module")
def server(smol_tokenizer):
    engine = Engine(OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))), max_tokens=64)
    return create_app(engine, model_name="oracle", max_new_tokens=512).state.server


@pytest.mark.parametrize(
    ("reply", "pcd", "per_value"),
    [
        (1000, None, 64),  # a long reply: each value keeps the engine's default
        (1000, {"max_tokens": 5}, 5),  # pcd's own limit per value
        (12, None, 12),  # a short reply: no value may be longer than the whole reply
        (12, {"max_tokens": 40}, 12),
    ],
)
def test_each_value_is_capped_by_pcd_and_never_above_the_reply(server, reply, pcd, per_value):
    options = extract_options(server, pcd, None, reply)
    assert server.engine.resolve(options).value_tokens == per_value


def test_the_reply_limit_is_the_clients_or_the_servers(server):
    assert token_limit(None, server, param="max_tokens") == 512
    assert token_limit(30, server, param="max_tokens") == 30
    with pytest.raises(HTTPError, match="at most 512 tokens"):
        token_limit(513, server, param="max_tokens")
    with pytest.raises(HTTPError, match="max_output_tokens"):
        token_limit(0, server, param="max_output_tokens")


@pytest.mark.parametrize(
    ("ask", "body"),
    [
        (
            openai_api._ask,
            ChatCompletionRequest(model="oracle", messages=[{"role": "user", "content": "Hi"}], max_tokens=20),
        ),
        (
            openai_api._ask,
            ChatCompletionRequest(
                model="oracle", messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=20
            ),
        ),
        (responses_api._ask, ResponsesRequest(model="oracle", input="Hi", max_output_tokens=20)),
    ],
    ids=["max_tokens", "max_completion_tokens", "max_output_tokens"],
)
def test_each_route_caps_the_reply_with_the_clients_number_and_values_within_it(server, ask, body):
    asked = ask(server, body)
    assert asked.max_new_tokens == 20  # free text and JSON objects: the whole reply
    assert server.engine.resolve(asked.options).value_tokens == 20  # min(the engine's 64, the reply's 20)
    wide = ask(server, body.model_copy(update={"pcd": {"max_tokens": 6}}))
    assert wide.max_new_tokens == 20 and server.engine.resolve(wide.options).value_tokens == 6
