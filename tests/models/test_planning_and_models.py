"""Wave and pass planning, scorer selection, and model-name resolution."""

from __future__ import annotations

import pytest

from pcd_engine import BackendUnavailableError, Engine, ModelLoadError, compile_schema
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.decide.compiler import compile_wave
from pcd_engine.decide.planner import plan_passes, plan_waves
from pcd_engine.errors import OptionError
from pcd_engine.lru import LRU
from pcd_engine.models.resolve import ALIASES, hub_offline, in_hub_cache, resolve_model
from pcd_engine.prompt.chat_prompt import ChatPrompt, TokenizerView
from tests.support import cache_in_hub, tiny_model

PRESET = {
    "a": {"type": "enum", "choices": ["x", "y"]},
    "b": {"type": "boolean"},
    "c": {"type": "boolean", "depends_on": ["b"]},
    "d": {"type": "enum", "choices": ["p", "q"], "depends_on": ["c", "a"]},
    "e": {"type": "boolean"},
}


def names(waves):
    return [[f.name for f in wave] for wave in waves]


def test_waves_with_and_without_anchor():
    schema = compile_schema(PRESET)
    assert names(plan_waves(schema, anchor=False)) == [["a", "b", "e"], ["c"], ["d"]]
    assert names(plan_waves(schema, anchor=True)) == [["a"], ["b", "e"], ["c"], ["d"]]
    single = compile_schema({"only": {"type": "boolean"}})
    assert names(plan_waves(single, anchor=True)) == [["only"]]


def test_anchor_skips_fields_with_dependencies():
    schema = compile_schema({"c": {"type": "boolean", "depends_on": ["b"]}, "b": {"type": "boolean"}})
    assert names(plan_waves(schema, anchor=True)) == [["b"], ["c"]]


@pytest.mark.parametrize("max_nodes", [1, 3, 8, 1000])
def test_passes_cover_every_node_once(smol_tokenizer, max_nodes):
    tv = TokenizerView(smol_tokenizer)
    schema = compile_schema(
        {"x": {"type": "enum", "choices": [f"LABEL_{i}" for i in range(30)]}, "y": {"type": "boolean"}}
    )
    prompt = ChatPrompt.build(tv, schema)
    wave = compile_wave(tv, schema.fields, boundary_text=prompt.boundary_text, tail_text=prompt.tail_text)
    passes = plan_passes(wave.tree, max_nodes=max_nodes)
    queried = [n for batch in passes for n in batch.query_nodes]
    assert sorted(queried) == list(range(len(wave.tree)))
    depth = max(wave.tree.depths)
    for batch in passes:
        assert len(batch.tokens) <= max(max_nodes, depth)
        for i, parent in enumerate(batch.parents):
            assert parent < i  # parents come first, and are in the same pass
        for row, node in zip(batch.query_rows, batch.query_nodes, strict=True):
            parent = wave.tree.parents[node]
            assert (row == -1) == (parent == -1)
            if row >= 0:
                assert batch.tokens[row] == wave.tree.tokens[parent]
    assert all(-1 not in b.query_rows for b in passes[1:])


def test_scorer_selection(smol_tokenizer):
    model = tiny_model("llama", len(smol_tokenizer))
    assert TorchBackend(model, smol_tokenizer).scorer == "packed"
    model.config.layer_types = ["full_attention", "linear_attention"]
    assert TorchBackend(model, smol_tokenizer).scorer == "rows"
    with pytest.raises(OptionError, match="Scorer 'packed': expected full or sliding attention layers"):
        TorchBackend(model, smol_tokenizer, scorer="packed")
    with pytest.raises(OptionError, match="Scorer: expected 'auto', 'packed' or 'rows'"):
        TorchBackend(model, smol_tokenizer, scorer="fast")


def test_model_names(tmp_path, fake_hub):
    # Online: a repo id that the Hub knows passes through to the loader.
    assert resolve_model("qwen2.5-0.5b") == ALIASES["qwen2.5-0.5b"].torch
    assert resolve_model("qwen2.5-0.5b", backend="mlx") == ALIASES["qwen2.5-0.5b"].mlx
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("someorg/some-model") == "someorg/some-model"
    with pytest.raises(ModelLoadError, match="the path does not exist"):
        resolve_model("./no/such/folder")
    with pytest.raises(ModelLoadError, match="expected an alias"):
        resolve_model("not-a-model")
    assert all(a.torch.count("/") == 1 for a in ALIASES.values())
    assert fake_hub == [ALIASES["qwen2.5-0.5b"].torch, ALIASES["qwen2.5-0.5b"].mlx, "someorg/some-model"]


def test_online_a_repo_the_hub_does_not_know_fails_at_once(fake_hub):
    with pytest.raises(ModelLoadError, match=r"Model 'someorg/missing-model': .* answered HTTP 404 .*check the name"):
        Engine.load("someorg/missing-model", backend="torch")


def test_online_but_unreachable_hub_fails_at_once_with_the_download_command(fake_hub, monkeypatch):
    """No HF_HUB_OFFLINE, and nothing answers: one refused request, not half a minute of transformers' retries."""
    import time

    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard: refused
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        Engine.load("qwen3-0.6b", backend="torch")
    assert time.perf_counter() - start < 5.0  # one request (transformers: about 27 s here)
    message = str(err.value)
    assert "did not answer" in message and "hf download Qwen/Qwen3-0.6B" in message
    assert "Engine.load('/path/to/folder')" in message and "HF_HUB_OFFLINE=1" in message


def test_offline_and_not_cached_says_how_to_download_at_once(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE is set (conftest): an alias or repo id missing from the cache fails at once, naming the
    download command and the local-folder option; one that is cached resolves to its repo id."""
    import time

    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    cache_in_hub(tmp_path, ALIASES["qwen3-0.6b"].torch)
    assert hub_offline() and in_hub_cache("Qwen/Qwen3-0.6B") and not in_hub_cache("Qwen/Qwen3-8B")
    assert resolve_model("qwen3-0.6b") == "Qwen/Qwen3-0.6B"
    for name, repo in [("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct"), ("someorg/not-cached", "someorg/not-cached")]:
        start = time.perf_counter()
        with pytest.raises(ModelLoadError) as err:
            Engine.load(name, backend="torch")
        assert time.perf_counter() - start < 1.0  # no retries against an unreachable Hub
        message = str(err.value)
        assert f"Model {name!r}" in message and f"hf download {repo}" in message
        assert "local model folder" in message and "Engine.load('/path/to/folder')" in message
    with pytest.raises(ModelLoadError, match="hf download mlx-community/Qwen3-0.6B-4bit"):
        resolve_model("qwen3-0.6b", backend="mlx")  # the MLX column is another repo, not cached


def test_unknown_backend():
    with pytest.raises(BackendUnavailableError, match="Backend: expected 'auto', 'torch' or 'mlx', but got 'jax'"):
        Engine.load(backend="jax")


def test_unloadable_repo_is_a_typed_error():
    with pytest.raises(ModelLoadError, match="Model 'someorg/not-cached'"):
        Engine.load("someorg/not-cached")


def test_the_embedded_model_is_converted_once_under_a_lock(tmp_path, monkeypatch):
    """Threads (or processes) asking for the embedded model at once: one converts, the others wait for it."""
    import threading
    import time

    from pcd_engine.models import resolve as models

    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "embedded_gguf", lambda: tmp_path / "model.gguf")
    calls = []

    def fake_convert(gguf, out, **_):
        calls.append(out)
        time.sleep(0.3)  # long enough for the other threads to arrive while it runs
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(models, "_convert", fake_convert)
    found = []
    threads = [threading.Thread(target=lambda: found.append(models.default_model_path())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert found == [tmp_path / "models" / "smollm2-135m-instruct"] * 4
    assert (found[0] / "model.safetensors").read_bytes() == b"weights"
    leftovers = [p for p in (tmp_path / "models").iterdir() if p.is_dir() and p.name.startswith(".smollm2-")]
    assert not leftovers  # the temporary folder went


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    from pcd_engine.models.resolve import cache_dir

    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("PCD_CACHE_DIR")
    assert cache_dir().name == "pcd"


def test_shared_engines_are_keyed_by_what_they_load(tiny_folder, tmp_path, monkeypatch):
    """``Engine.shared`` loads a model once per process under any name for it (a trailing slash, a symbolic link),
    and once more for another precision; ``Engine.load`` always loads."""
    from pcd_engine import engine as engine_module

    monkeypatch.setattr(engine_module, "_SHARED", LRU(engine_module.SHARED_ENGINES))
    loads: list[tuple[str, str | None]] = []
    load = TorchBackend.load

    def counting(path, **kwargs):
        loads.append((path, kwargs.get("dtype")))
        return load(path, **kwargs)

    monkeypatch.setattr(TorchBackend, "load", counting)
    (tmp_path / "link").symlink_to(tiny_folder)
    first = Engine.shared(tiny_folder, backend="torch")
    assert Engine.shared(tiny_folder + "/", backend="torch") is first
    assert Engine.shared(str(tmp_path / "link"), backend="torch") is first
    assert len(loads) == 1
    half = Engine.shared(tiny_folder, backend="torch", dtype="bfloat16")
    assert half is not first and loads[-1][1] == "bfloat16" and len(loads) == 2
    assert Engine.load(tiny_folder, backend="torch") is not first and len(loads) == 3
    engine_module._SHARED.capacity = 2  # the 2 most recently used of the 3 stay: float32, then bfloat16
    assert Engine.shared(tiny_folder, backend="torch") is first  # now the most recently used
    Engine.shared(tiny_folder, backend="torch", dtype="float32")  # past the bound: bfloat16 is dropped
    assert len(loads) == 4 and len(engine_module._SHARED) == 2
    assert Engine.shared(tiny_folder, backend="torch") is first and len(loads) == 4
    assert Engine.shared(tiny_folder, backend="torch", dtype="bfloat16") is not half and len(loads) == 5


def test_a_model_folder_that_names_its_own_code_is_never_run(tiny_folder, tmp_path):
    """Its code is never imported and nothing prompts (trust_remote_code=False, explicit): a folder of a model
    transformers knows loads with transformers' own classes, one it does not know is a ModelLoadError."""
    import json
    import shutil

    marker = tmp_path / "ran"
    for model_type in ("llama", "evil_llama"):
        folder = tmp_path / model_type
        shutil.copytree(tiny_folder, folder)
        for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
            (folder / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Evil: pass\n")
        config = json.loads((folder / "config.json").read_text())
        config["model_type"] = model_type
        config["auto_map"] = {
            "AutoConfig": "configuration_evil.Evil",
            "AutoModelForCausalLM": "modeling_evil.Evil",
            "AutoTokenizer": ["tokenization_evil.Evil", None],
        }
        (folder / "config.json").write_text(json.dumps(config))
        if model_type == "llama":
            assert TorchBackend.load(str(folder)).max_context > 0
        else:
            with pytest.raises(ModelLoadError, match="names its own Python code, which pcd never runs"):
                TorchBackend.load(str(folder))
    assert not marker.exists()


class _Planted:
    """Unpickling this writes a marker file: what a hostile pickled checkpoint can do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("backend", ["torch", pytest.param("mlx", marks=pytest.mark.mlx)])
def test_a_folder_pcd_cannot_load_safely_is_a_model_load_error_before_any_loader(tiny_folder, tmp_path, backend):
    """No config.json, a config that is not a JSON object, only pickled weights, no weights: each a ModelLoadError
    naming the folder, raised by the one folder check both backends run first (the pickle is never opened)."""
    import pickle
    import shutil

    from pcd_engine.backends.model_folder import check_model_folder

    marker = tmp_path / "ran"
    cases = {}
    cases["no-config"] = tmp_path / "no-config"
    shutil.copytree(tiny_folder, cases["no-config"])
    (cases["no-config"] / "config.json").unlink()
    cases["bad-config"] = tmp_path / "bad-config"
    shutil.copytree(tiny_folder, cases["bad-config"])
    (cases["bad-config"] / "config.json").write_text("[1, 2]")
    cases["pickled"] = tmp_path / "pickled"
    shutil.copytree(tiny_folder, cases["pickled"])
    (cases["pickled"] / "model.safetensors").unlink()
    (cases["pickled"] / "pytorch_model.bin").write_bytes(pickle.dumps(_Planted(str(marker))))
    cases["no-weights"] = tmp_path / "no-weights"
    shutil.copytree(tiny_folder, cases["no-weights"])
    (cases["no-weights"] / "model.safetensors").unlink()
    needles = {
        "no-config": "has no config.json",
        "bad-config": "expected config.json to hold a JSON object, but got list",
        "pickled": r"holds only pickled ones \(pytorch_model.bin\), which pcd never loads",
        "no-weights": r"expected weights in \*.safetensors files, but the folder holds none",
    }
    for name, folder in cases.items():
        with pytest.raises(ModelLoadError, match=needles[name]):
            check_model_folder(str(folder))
        with pytest.raises(ModelLoadError, match=needles[name]):
            Engine.load(str(folder), backend=backend)
    assert not marker.exists()
    check_model_folder(tiny_folder)  # a good folder passes


@pytest.mark.slow
def test_loading_a_folder_that_names_its_code_never_prompts_on_a_terminal(tiny_folder, tmp_path):
    """transformers asks on a terminal whether to run a folder's code when trust_remote_code is left unset: pcd
    sets it, so a load under a pseudo-terminal neither prompts nor runs the code (it ends on its own, the marker
    file the code would write never appears)."""
    import json
    import os
    import pty
    import select
    import shutil
    import subprocess
    import sys
    import time

    marker = tmp_path / "ran"
    folder = tmp_path / "evil"
    shutil.copytree(tiny_folder, folder)
    (folder / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Evil: pass\n")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil_llama"
    config["auto_map"] = {"AutoConfig": "tokenization_evil.Evil", "AutoTokenizer": ["tokenization_evil.Evil", None]}
    (folder / "config.json").write_text(json.dumps(config))
    script = (
        "from pcd_engine import Engine, ModelLoadError\n"
        f"try:\n    Engine.load({str(folder)!r}, backend='torch')\n"
        "except ModelLoadError as exc:\n    print('refused:', exc)\n"
    )
    main, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([main], [], [], 0.5)[0]:
            try:
                seen += os.read(main, 4096)
            except OSError:
                break
    try:  # the terminal closes (EIO) as the child exits, a moment before it can be reaped
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the load waited on the terminal: {seen.decode(errors='replace')[-500:]}")
    os.close(main)
    assert proc.returncode == 0
    assert b"refused:" in seen and b"which pcd never runs" in seen
    assert b"Do you wish to run the custom code" not in seen and not marker.exists()
