"""GGUF files as models: ``Engine.load("x.gguf")``, a folder holding one, and a name in a local Ollama store.

The GGUF here is written by the ``gguf`` package: the embedded SmolLM2's first two blocks (quantized Q4_1 / Q8_0
as shipped) with its tokenizer. Loaded through pcd it must equal the same two blocks loaded from the embedded
model's converted folder; it converts once per file, also when two processes ask at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from pcd_engine import Engine, ModelLoadError, OptionError
from pcd_engine.backends.torch import TorchBackend
from pcd_engine.models import resolve as models_module
from pcd_engine.models.resolve import gguf_model_path, ollama_gguf, resolve_model
from tests.conformance import SHARED_PREFIXES, TEXT
from tests.support import mlx_available, write_truncated_gguf

LAYERS = 2


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_truncated_gguf(
        models_module.embedded_gguf(), tmp_path_factory.mktemp("gguf") / "smol-2l.gguf", layers=LAYERS
    )


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PCD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow  # converts the real model's two blocks and its 49k-token embedding
def test_a_gguf_file_loads_as_the_same_weights_from_the_folder(tiny_gguf, own_cache, smol_path, monkeypatch):
    engine = Engine.load(str(tiny_gguf), backend="torch")
    folder = Path(resolve_model(str(tiny_gguf)))
    assert folder.parent == own_cache / "models" / "gguf" and folder.name.startswith("smol-2l-")
    reference = AutoModelForCausalLM.from_pretrained(smol_path, num_hidden_layers=LAYERS).eval()
    ids = torch.tensor([engine.backend.tokenizer.encode(TEXT)])
    with torch.no_grad():
        torch.testing.assert_close(engine.backend.model(ids).logits, reference(ids).logits, atol=1e-5, rtol=0)
    expected = Engine(TorchBackend(reference, engine.backend.tokenizer)).extract(TEXT, SHARED_PREFIXES)
    got = engine.extract(TEXT, SHARED_PREFIXES)
    assert got.values == expected.values
    for name, field in expected.fields.items():
        assert got.fields[name].probability == pytest.approx(field.probability, abs=1e-5)

    # Converted once: later loads (the file, or the folder holding it) reuse the folder.
    monkeypatch.setattr(models_module, "_convert", lambda *a, **k: pytest.fail("converted a second time"))
    assert resolve_model(str(tiny_gguf)) == str(folder)
    assert resolve_model(str(tiny_gguf.parent)) == str(folder)
    if mlx_available():  # the converted folder is plain fp32 safetensors: MLX loads it unquantized
        on_mlx = Engine.load(str(tiny_gguf), backend="mlx").extract(TEXT, SHARED_PREFIXES)
        assert on_mlx.values == got.values


@pytest.mark.slow  # converts the real model's two blocks and its 49k-token embedding
def test_a_gguf_converts_to_bfloat16_in_a_folder_of_its_own(tiny_gguf, own_cache):
    """``dtype="bfloat16"`` halves the converted folder: its own folder, bf16 tensors, the fp32 model's values
    rounded to bf16 (the same decisions on the probe)."""
    from safetensors import safe_open

    engine = Engine.load(str(tiny_gguf), backend="torch", dtype="bfloat16")
    folder = Path(resolve_model(str(tiny_gguf), dtype="bfloat16"))
    assert folder.name.endswith("-bf16") and folder != Path(resolve_model(str(tiny_gguf)))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    full = Engine.load(str(tiny_gguf), backend="torch")
    for name, param in engine.backend.model.named_parameters():
        wide = dict(full.backend.model.named_parameters())[name]
        assert param.dtype == torch.bfloat16 and torch.equal(param, wide.to(torch.bfloat16)), name
    # the model's own decisions (a lean correction on a two-layer model amplifies the bf16 rounding): every label's
    # probability within bf16's rounding, and the same answer wherever fp32's is not a near tie (a 0.436 / 0.419 split
    # between two labels flipped under bf16 with one install's GGUF reader and not with another's)
    raw = {"correction": "none"}
    narrow, wide = engine.extract(TEXT, SHARED_PREFIXES, **raw), full.extract(TEXT, SHARED_PREFIXES, **raw)
    clear = 0
    for name, want in wide.fields.items():
        got = narrow.fields[name]
        probabilities = {a.value: a.probability for a in got.alternatives}
        assert all(abs(probabilities.get(a.value, 0.0) - a.probability) < 0.05 for a in want.alternatives), name
        runner_up = want.alternatives[1].probability if len(want.alternatives) > 1 else 0.0
        if want.probability - runner_up > 0.05:
            clear += 1
            assert got.value == want.value, name
    assert clear >= 3
    with pytest.raises(OptionError, match="dtype: expected 'float32', 'bfloat16' or 'float16', but got 'int4'"):
        gguf_model_path(tiny_gguf, dtype="int4")


@pytest.mark.slow  # converts the real model's two blocks and its 49k-token embedding
def test_two_processes_loading_one_gguf_convert_it_once(tiny_gguf, own_cache):
    script = (
        "import sys\n"
        "from pcd_engine.models import resolve as models\n"
        "real = models._convert\n"
        "def counted(gguf, out, **kw):\n"
        "    print('converted', flush=True)\n"
        "    real(gguf, out, **kw)\n"
        "models._convert = counted\n"
        "print(models.resolve_model(sys.argv[1]))\n"
    )
    env = {**os.environ, "PCD_CACHE_DIR": str(own_cache)}
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(tiny_gguf)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outs = [run.communicate(timeout=300)[0].split() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert sum(out.count("converted") for out in outs) == 1
    assert outs[0][-1] == outs[1][-1] and Path(outs[0][-1]).joinpath("model.safetensors").is_file()
    leftovers = [p.name for p in Path(outs[0][-1]).parent.iterdir() if p.name.startswith(".smol-2l-") and p.is_dir()]
    assert not leftovers


def test_an_ollama_model_name_loads_its_gguf_blob(tiny_gguf, own_cache, tmp_path, monkeypatch):
    store = tmp_path / "ollama"
    blob = store / "blobs" / "sha256-0123abcd"
    blob.parent.mkdir(parents=True)
    shutil.copyfile(tiny_gguf, blob)
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smol" / "2l"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        '{"layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256-ffff"},'
        ' {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:0123abcd"}]}'
    )
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert ollama_gguf("smol:2l") == blob
    assert ollama_gguf("registry.ollama.ai/library/smol:2l") == blob
    assert ollama_gguf("smol") is None  # no "latest" tag in this store
    converted = []
    monkeypatch.setattr(
        models_module, "gguf_model_path", lambda path, **_: converted.append(path) or Path("/converted")
    )
    assert resolve_model("smol:2l") == "/converted" and converted == [blob]
    with pytest.raises(ModelLoadError, match=r"Model 'smol:9b'.*a model in the local Ollama store"):
        resolve_model("smol:9b")


def test_gguf_errors_name_the_file(tmp_path, own_cache):
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelLoadError, match=r"GGUF '.*weights.gguf': expected a file that starts with b'GGUF'"):
        Engine.load(str(not_gguf))
    with pytest.raises(ModelLoadError, match=r"Model '.*missing.gguf': expected an existing folder or .gguf file"):
        resolve_model(str(tmp_path / "missing.gguf"))
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"holds 2: a.gguf, b.gguf. Pass the file itself"):
        resolve_model(str(two))
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00cut short")
    with pytest.raises(ModelLoadError, match=r"GGUF '.*cut.gguf': expected a model that transformers can read"):
        resolve_model(str(truncated))
    with pytest.raises(ModelLoadError, match="no such file"):
        gguf_model_path(tmp_path / "nope.gguf")
    assert not (own_cache / "models").exists() or not any((own_cache / "models").rglob("*.safetensors"))
