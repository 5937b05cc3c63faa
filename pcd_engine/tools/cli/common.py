"""What the commands share: loading the engine, the decoding flags as one options object, the model flags."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import InputError, OptionError
from pcd_engine.models.resolve import DEFAULT_MODEL
from pcd_engine.options import CORRECTIONS, STRATEGIES, STRATEGY_ALIASES, ExtractOptions, surface_options

if TYPE_CHECKING:
    from pcd_engine.engine import Engine


__all__ = [
    "check_output",
    "count",
    "describe",
    "extract_options",
    "load_engine",
    "read_schema",
    "with_decoding",
    "with_model",
]


def count(text: str) -> int:
    """An argparse ``type`` for a count of documents: an integer of at least 1 (``--limit 0`` or ``-3`` would
    otherwise read everything, or all but three)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count of documents (an integer >= 1), but got {text!r}")
    return value


def check_output(path: str, what: str = "Output") -> Path:
    """``path`` as a file the command will write, refused before any work unless it names a file in an existing,
    writable folder.

    Raises:
        InputError: Naming ``what`` and the path.
    """
    out = Path(path)
    if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise InputError(f"{what} {path!r}: expected a file path in an existing folder this process can write to.")
    return out


def extract_options(args: argparse.Namespace) -> ExtractOptions:
    """The decoding flags of ``run``, ``eval``, ``calibrate`` and ``tag`` as one :class:`ExtractOptions` (unset
    flags keep defaults; ``--calibration`` and ``--head`` are read from their files)."""
    from pcd_engine.calibrate.calibrator import Calibrator
    from pcd_engine.heads.head import Head

    flags = {
        "strategy": args.strategy,
        "anchor": False if args.no_anchor else None,
        "temperature": args.temperature,
        "memory_budget_mb": args.memory_budget_mb,
        "instructions": args.instructions,
        "list_choices": False if args.no_list_choices else None,
        "quoted_booleans": True if args.quoted_booleans else None,
        "min_probability": args.min_probability,
        "correction": args.correction,
        "label_orders": args.label_orders,
    }
    calibration = Calibrator.load(args.calibration) if args.calibration else None
    head = Head.load(args.head) if getattr(args, "head", None) else None
    return surface_options(("pcd flags", flags), max_tokens=args.max_tokens, calibration=calibration, head=head)


def read_schema(args: argparse.Namespace) -> Any:
    """The compiled schema of a command that takes exactly one of ``--schema S.json`` and ``--preset PRESET``.

    Raises:
        OptionError: If it got both or neither.
    """
    from pcd_engine.schema import compile_schema
    from pcd_engine.tools.terminal import read_json, read_preset

    if bool(args.preset) == bool(args.schema):
        got = "both" if args.preset else "neither"
        raise OptionError(f"Schema: expected exactly one of --schema S.json and --preset PRESET, but got {got}.")
    return compile_schema(read_preset(args.preset)[1].schema if args.preset else read_json(args.schema, "Schema"))


def load_engine(args: argparse.Namespace) -> Any:
    from pcd_engine.engine import Engine

    name = None if args.model in ("default", DEFAULT_MODEL) else args.model
    if args.quiet:
        try:  # transformers draws its own "Loading weights" bar
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
    else:
        print(f"pcd: loading {args.model} ({args.backend} backend)", file=sys.stderr)
    return Engine.load(name, backend=args.backend, device=args.device, dtype=args.dtype)


def describe(engine: Engine) -> str:
    backend = engine.backend
    return f"backend {backend.name} ({backend.scorer} scorer), python {platform.python_version()}"


def with_model(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="?" if optional else None,
        default="default",
        help=f"'default' (the embedded {DEFAULT_MODEL}, offline), an alias (pcd models), a folder, a .gguf file, "
        "a model in the local Ollama store or a repo id",
    )
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "mlx"), help="default: auto")
    p.add_argument("--device", default=None, help="torch device (cpu, cuda) or MLX device (cpu, gpu)")
    p.add_argument(
        "--dtype", default=None, choices=("float32", "bfloat16", "float16"), help="weights (a GGUF converts to it)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or loading messages")


def with_decoding(p: argparse.ArgumentParser) -> None:
    """The flags that map onto :class:`~pcd_engine.options.ExtractOptions` (see :func:`_options`)."""
    p.add_argument(
        "--strategy",
        default=None,
        choices=(*STRATEGIES, *STRATEGY_ALIASES),
        help="how labels are decided (default: auto; first_token, trie and greedy are the first pcd's names)",
    )
    p.add_argument("--no-anchor", action="store_true", help="decide every field in one pass (no anchor wave)")
    p.add_argument("--temperature", type=float, default=None, help="reshape the reported probabilities (> 0)")
    p.add_argument("--max-tokens", type=int, default=None, help="token limit of each generated field's value")
    p.add_argument("--memory-budget-mb", type=float, default=None, help="peak memory of one pass, in MiB")
    p.add_argument("--instructions", default=None, help="text that replaces pcd's own instruction sentence")
    p.add_argument("--no-list-choices", action="store_true", help="do not list the allowed values in the prompt")
    p.add_argument("--quoted-booleans", action="store_true", help='write booleans as "true" / "false"')
    p.add_argument(
        "--calibration", metavar="CAL.json", default=None, help="correct label priors with a pcd calibrate file"
    )
    p.add_argument(
        "--head", metavar="HEAD.json", default=None, help="decide the fields it has heads for with a pcd fit file"
    )
    p.add_argument(
        "--min-probability",
        type=float,
        default=None,
        metavar="P",
        help="abstain below this probability: Optional fields answer null, the others are flagged",
    )
    p.add_argument(
        "--label-orders",
        type=int,
        default=None,
        metavar="K",
        help="read every single-choice field's labels in K orders (its own, reversed, then shifted; at most 8) and "
        "decide by their mean: answers that do not follow where a label was listed",
    )
    p.add_argument(
        "--correction",
        default=None,
        choices=CORRECTIONS,
        help="divide out the model's label lean: the lean read on content-free inputs, from the small single-choice "
        "fields (auto, the default: an answer never depends on the other documents) or from every closed field "
        "(content_free); estimated on the documents of one call, assuming balanced labels (batch); or not at all "
        "(none: the model's own decisions)",
    )
