"""The backend contract: 6 abstract methods every backend implements, and the capabilities a backend may declare
(:mod:`pcd_engine.backends.capabilities`). A scorer that implements the contract only, as a remote one would,
decides every closed field exactly as a full backend does, and a call that needs more is refused by name before
any pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcd_engine import BackendCapabilityError, Engine, Head
from pcd_engine.backends.contract import Backend
from pcd_engine.testing import check_backend
from tests.support import OracleBackend, OracleLM, forcing_head

REQUIRED = {"max_context", "prefill", "start", "score_tree", "stream_greedy", "pass_bytes"}
EVERY = {"open rows", "packed trees", "row broadcast", "batched documents", "feature taps", "plain reference"}
TEXT = "The parcel arrived broken and nobody answers my emails. I want my money back."
CLOSED = {
    "title": "Ticket",
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["POSITIVE", "NEUTRAL", "NEGATIVE"]},
        "refund": {"type": "boolean"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "team": {"anyOf": [{"type": "string", "enum": ["billing", "shipping"]}, {"type": "null"}]},
    },
    "required": ["sentiment", "refund", "priority", "team"],
}
WITH_OPEN = {**CLOSED, "properties": {**CLOSED["properties"], "note": {"type": "string"}}}


class Remote(Backend):
    """The contract and nothing more: each method forwards to an oracle, as a client of a remote scorer would."""

    name, scorer = "remote", "remote"

    def __init__(self, far: OracleBackend) -> None:
        self.far, self.tokenizer = far, far.tokenizer

    @property
    def max_context(self) -> int:
        return self.far.max_context

    def prefill(self, ids, *, chunk=None):
        self.forward_passes += 1
        return self.far.prefill(ids, chunk=chunk)

    def start(self, prefix):
        return self.far.start(prefix)

    def score_tree(self, state, *, causal, batch):
        self.forward_passes += 1
        return self.far.score_tree(state, causal=causal, batch=batch)

    def stream_greedy(self, ids, *, max_new_tokens):
        return self.far.stream_greedy(ids, max_new_tokens=max_new_tokens)

    def pass_bytes(self, *, past, new, rows):
        return self.far.pass_bytes(past=past, new=new, rows=rows)


@pytest.fixture(scope="module")
def pair(smol_tokenizer):
    lm = OracleLM(len(smol_tokenizer))
    return Engine(Remote(OracleBackend(smol_tokenizer, lm))), Engine(OracleBackend(smol_tokenizer, lm))


def test_the_contract_is_six_abstract_methods_and_the_readme_says_so():
    assert Backend.__abstractmethods__ == REQUIRED
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    backends = readme[readme.index("## Backends") :]
    assert f"{len(REQUIRED)} abstract\nmethods" in backends or f"{len(REQUIRED)} abstract methods" in backends
    assert all(f"`{name}`" in backends for name in REQUIRED)


def test_a_backend_with_the_contract_only_declares_nothing_and_decides_every_closed_field(pair):
    remote, local = pair
    assert remote.backend.capabilities == frozenset()
    many = remote.extract_many([TEXT, TEXT.upper()], CLOSED)
    for text, got in zip([TEXT, TEXT.upper()], many, strict=True):
        want = local.extract(text, CLOSED)
        assert got.values == want.values
        for name, field in want.fields.items():
            assert got.fields[name].probability == pytest.approx(field.probability, abs=1e-12)


def test_what_needs_a_capability_is_refused_by_name_before_any_pass(pair, tiny_engine):
    remote, _ = pair
    before = remote.backend.forward_passes
    with pytest.raises(
        BackendCapabilityError,
        match=r"'remote': expected the 'open rows' capability to generate the open fields \['note'\]",
    ):
        remote.extract(TEXT, WITH_OPEN)
    fitted = forcing_head(tiny_engine, CLOSED, "sentiment", "POSITIVE")  # made where features can be read
    head = Head.from_json({**fitted.to_json(), "model": remote.model_id})
    with pytest.raises(BackendCapabilityError, match="expected the 'feature taps' capability"):
        remote.extract(TEXT, CLOSED, head=head)
    assert remote.backend.forward_passes == before
    with pytest.raises(BackendCapabilityError, match="expected the 'plain reference' capability"):
        check_backend(remote)


def test_what_the_backends_declare(tiny_engine, smol_tokenizer):
    assert tiny_engine.backend.capabilities == EVERY
    # The oracle grows open rows by its own generate_rows, and declares nothing else.
    assert OracleBackend(smol_tokenizer, OracleLM(len(smol_tokenizer))).capabilities == {"open rows"}
