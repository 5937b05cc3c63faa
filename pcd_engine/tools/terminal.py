"""What the command line shares with the terminal: Markdown tables, progress bars, and reading the user's files
(every failure an :class:`~pcd_engine.errors.InputError` that names the file)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pcd_engine.errors import InputError
from pcd_engine.schema import Preset, load_preset
from pcd_engine.tools.examples import EXAMPLE_PRESETS, example_preset

__all__ = [
    "dataset_name",
    "progress",
    "chunk_sizes",
    "read_json",
    "read_preset",
    "read_text",
    "RESULT_COLUMNS",
    "result_rows",
    "shorten",
    "show_table",
    "table",
    "versions",
    "write_json",
]


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table with its columns padded to line up (plain text: what piped output and files get)."""
    cells = [[str(c) for c in columns], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells[1:]]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return " ".join(str(value).split("\n")).replace("|", "\\|")


def show_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, file: Any = None, console: Any = None) -> None:
    """Print a table: on a terminal with rich (aligned, long values wrapped to the width, a bold header), else as
    :func:`table` (plain padded Markdown, no escape codes).

    Args:
        columns: The column names.
        rows: The rows, one value per column.
        file: Where to print (default stdout); a terminal gets rich's table.
        console: A ``rich.console.Console`` to print to instead (a recording one can save the table as SVG).
    """
    out = sys.stdout if file is None else file
    if console is None and not getattr(out, "isatty", lambda: False)():
        print(table(columns, rows), file=out)
        return
    from rich.console import Console
    from rich.table import Table

    grid = Table(*columns, header_style="bold", show_lines=False, expand=False)
    for row in rows:
        grid.add_row(*(str(c) for c in row))
    (console or Console(file=out, soft_wrap=False)).print(grid)


RESULT_COLUMNS = ("field", "value", "probability", "candidate mass", "next alternatives")
"""The columns of :func:`result_rows`."""


def result_rows(out: Any) -> list[tuple[str, ...]]:
    """One row per field of an :class:`~pcd_engine.result.ExtractionResult`: its value (JSON), probability (or
    "generated"; a calibrated one with the model's raw figure, an abstained one marked), candidate mass and the two
    runners-up (never the answer itself), for :func:`show_table`."""

    def js(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    def probability(f: Any) -> str:
        if f.probability is None:
            return "generated"
        raw = "" if f.raw_probability is None else f" (raw {f.raw_probability:.2f})"
        return f"{f.probability:.2f}{raw}" + (", abstained" if f.abstained else "")

    return [
        (
            f.name,
            js(f.value),
            probability(f),
            "-" if f.candidate_mass is None else f"{f.candidate_mass:.2f}",
            ", ".join(f"{js(a.value)}={a.probability:.2f}" for a in f.runners_up()),
        )
        for f in out.fields.values()
    ]


def shorten(text: str, width: int = 200) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis and the full length when longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else f"{flat[: width - 1]}… ({len(flat)} characters)"


@contextmanager
def progress(
    total: int, *, quiet: bool, unit: str = "step", delay: float = 1.0, sizes: Sequence[int] | None = None
) -> Iterator[Callable[[str], None]]:
    """A tqdm bar on stderr; yields ``tick(description)``, called as each step starts, with its name.

    The bar shows the step that is running: the count of what is finished and the running step's name change in
    one refresh, and it ends at ``total/total``. A command that ends within ``delay`` seconds shows nothing; past
    it, the bar appears even in the middle of a long first step, and its clock keeps moving (a refresh every
    second) while a step runs.

    Args:
        total: What the bar counts to: the number of steps, or of items (documents) when ``sizes`` is given.
        quiet: Show nothing.
        unit: What the bar counts (a step, a document).
        delay: Seconds before the bar first appears.
        sizes: How many items each step handles, in order (a chunk of documents); ``None``: one each.
    """
    import threading

    from tqdm.auto import tqdm

    # mininterval=0: every step start is drawn (steps are long enough), so the label is never a step behind.
    bar = tqdm(
        total=total,
        unit=unit,
        file=sys.stderr,
        disable=quiet,
        delay=delay,
        leave=False,
        dynamic_ncols=True,
        mininterval=0,
    )
    opened = time.monotonic()
    started = [False]
    steps = iter(sizes) if sizes is not None else None
    running = [0]  # the size of the step that is running
    lock = threading.Lock()
    stop = threading.Event()

    def tick(description: str) -> None:
        with lock:
            bar.set_description(description, refresh=False)
            if started[0]:
                bar.update(running[0])  # refreshes with the new step's name
            elif delay <= 0:
                bar.refresh()
            started[0] = True
            running[0] = 1 if steps is None else next(steps, 0)

    def keep_showing() -> None:
        if not stop.wait(delay):
            while True:
                with lock:
                    bar.refresh()
                if stop.wait(1.0):
                    return

    clock = None if quiet else threading.Thread(target=keep_showing, daemon=True)
    if clock is not None:
        clock.start()
    try:
        yield tick
        if started[0]:
            with lock:
                bar.update(running[0])
                if time.monotonic() - opened >= delay:  # shown: its last frame says total/total
                    bar.refresh()
    finally:
        stop.set()
        if clock is not None:
            clock.join()
        bar.close()


def chunk_sizes(count: int, size: int) -> list[int]:
    """The sizes of the chunks of ``size`` that ``count`` items are read in (the last one shorter): a bar's
    ``sizes``."""
    return [min(size, count - first) for first in range(0, count, max(1, size))]


def read_text(path: str, what: str) -> str:
    """The text of ``path`` (``-`` reads stdin); ``what`` names it in messages."""
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path!r}: expected an existing file, but it does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {path!r}: expected a readable UTF-8 text file, but reading failed ({exc}).") from None


def read_json(path: str, what: str) -> Any:
    """The JSON value in ``path``; ``what`` names it in messages."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what} {path!r}: expected JSON, but got bad JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})."
        ) from None
    except RecursionError:
        raise InputError(f"{what} {path!r}: expected JSON, but it is nested too deeply to read.") from None


def read_preset(ref: str) -> tuple[str, Preset]:
    """An example preset by name, or a preset file by path, with its name."""
    if ref in EXAMPLE_PRESETS:
        return ref, example_preset(ref)
    if not ref.endswith(".json") and not os.path.exists(ref):
        raise InputError(f"Preset {ref!r}: expected an example preset ({', '.join(EXAMPLE_PRESETS)}) or a .json file.")
    return Path(ref).stem, load_preset(read_json(ref, "Preset"))


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path``."""
    try:
        Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"JSON output {path!r}: expected a writable path, but writing failed ({exc}).") from None


def dataset_name(ref: str) -> str:
    """A short name for a dataset argument: the name itself, or the last two parts of its path."""
    return ref if not os.path.exists(ref) else "/".join(Path(ref).resolve().parts[-2:])


def versions() -> str:
    """The versions of the libraries a benchmark depends on, and the machine."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "transformers", "outlines", "outlines_core", "mlx", "mlx-lm"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found) + f"; python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus"
