"""The ``pcd`` command: models, check, run, decide, bench, eval, calibrate, fit, promote, tag and serve.

``main(argv)`` parses with :func:`build_parser`, runs one sub-command and returns its exit code. Every error pcd
raises on purpose (and a missing or unreadable file, bad JSON) becomes one line on stderr and exit code 1; usage
errors exit 2 (argparse). Tables go to stdout as Markdown, progress bars to stderr (tqdm, shown only for steps
that take more than a second, and never with ``--quiet``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pcd_engine.errors import PCDError
from pcd_engine.tools.cli import bench, calibrate, check, decide, eval, fit, models, promote, run, serve, tag

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``pcd`` argument parser with its twelve sub-commands."""
    parser = argparse.ArgumentParser(
        prog="pcd",
        description="Structured decisions from local LLMs: every label of every field decided in parallel.",
    )
    parser.add_argument("--version", action="version", version=f"pcd {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (models, check, run, decide, bench, eval, calibrate, fit, promote, tag, serve):
        command.add(sub)
    return parser


def _version() -> str:
    import pcd_engine

    return pcd_engine.__version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pcd`` command line.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit code: 0 on success, 1 on an error or a failed check, 2 on a usage error, 130 on Ctrl-C, 141 when
        the reader of the output went away (``pcd models | head -1``), as if killed by SIGPIPE.
    """
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except PCDError as exc:
        said = str(exc).removeprefix(f"pcd {args.command}: ")  # the command is named once
        print(f"pcd {args.command}: error: {said}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pcd {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line never shows a traceback unless asked to
        if os.environ.get("PCD_DEBUG"):
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"pcd {args.command}: unexpected error: {type(exc).__name__}: {message} (PCD_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's final flush of what is still buffered does not
    fail on the closed pipe again (and print "Exception ignored ...")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (captured): nothing will flush to the pipe
        pass
