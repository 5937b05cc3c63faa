"""``pcd serve``: the web page and the OpenAI-compatible server on loopback."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import BackendUnavailableError, check_count, pip_install
from pcd_engine.limits import SERVER_LIMITS, SERVER_MAX_NEW_TOKENS, RequestLimits
from pcd_engine.models.resolve import DEFAULT_MODEL
from pcd_engine.options import check_batch_size
from pcd_engine.tools.cli import common

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_serve"]


def add(sub: Any) -> None:
    p = sub.add_parser("serve", help="the side-by-side web page, a JSON API and an OpenAI-compatible endpoint")
    common.with_model(p, optional=True)
    p.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    p.add_argument("--port", type=int, default=8000, help="default: 8000")
    p.add_argument("--name", default=None, help="model id for /v1 (default: MODEL)")
    limits = SERVER_LIMITS
    p.add_argument("--max-labels", type=int, default=limits.max_labels, help="allowed values per request (0: no limit)")
    p.add_argument(
        "--max-generated-tokens",
        type=int,
        default=limits.max_generated_tokens,
        help="tokens generated per request over all open fields (0: no limit)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=SERVER_MAX_NEW_TOKENS,
        help="the most tokens of one free-text reply, and the most a request's max_tokens may ask for (default: "
        f"{SERVER_MAX_NEW_TOKENS})",
    )
    p.add_argument("--time-limit", type=float, default=limits.time_limit_s, help="seconds per request (0: no limit)")
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for a request's headers, and for its whole body",
    )
    p.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME", help="another Host name to accept (repeatable)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 and /api (default: $PCD_API_KEY; none: open)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin whose pages may call the API from a browser (repeatable; default: none)",
    )
    p.add_argument(
        "--batch-window",
        type=float,
        default=5.0,
        metavar="MS",
        help="decide extractions arriving within MS milliseconds of each other in one batch (default: 5; -1: never)",
    )
    p.add_argument("--max-batch", type=int, default=None, help="the most extractions in one batch (default: engine's)")
    p.add_argument("--log", default=None, metavar="LOG.jsonl", help="append /api/extract requests and the outcomes "
                   "POST /api/outcomes reports (pcd fit --log reads them)")  # fmt: skip
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from pcd_engine.tools.serve import create_app, header_timeout_protocol

    try:
        import uvicorn
    except ImportError:
        message = f"pcd serve: expected uvicorn, but it is not installed. Install it with: {pip_install('serve')}"
        raise BackendUnavailableError(message) from None
    limits = RequestLimits(
        max_labels=args.max_labels or None,
        max_generated_tokens=args.max_generated_tokens or None,
        time_limit_s=args.time_limit or None,
    )
    check_batch_size(args.max_batch)  # before the model loads
    check_count(args.max_new_tokens, "pcd serve --max-new-tokens")
    api_key = args.api_key or os.environ.get("PCD_API_KEY") or None
    loopback = args.host in ("localhost", "127.0.0.1", "::1")
    if not loopback and not api_key:
        print(
            f"pcd: warning: serving on {args.host} (not loopback) without an API key: anyone who can reach this "
            "address can use the model. Pass --api-key or set PCD_API_KEY.",
            file=sys.stderr,
        )
    engine = common.load_engine(args)
    from pcd_engine.models.resolve import model_names, resolve_model

    given = None if args.model in ("default", DEFAULT_MODEL) else args.model
    resolved = resolve_model(given, backend=engine.backend.name, dtype=args.dtype)
    app = create_app(
        engine,
        model_name=args.name or args.model,
        max_new_tokens=args.max_new_tokens,
        limits=limits,
        body_timeout_s=args.body_timeout,
        host=args.host,
        allowed_hosts=args.allow_host,
        aliases=model_names(args.model, resolved),  # every name `pcd models` lists for it
        api_key=api_key,
        cors_origins=args.cors_origin,
        batch_window_ms=None if args.batch_window < 0 else args.batch_window,
        max_batch=args.max_batch,
        log=args.log,
    )
    if not args.quiet:
        print(f"pcd: serving {args.model} on http://{args.host}:{args.port}/ (OpenAI API at /v1)", file=sys.stderr)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning" if args.quiet else "info",
        http=header_timeout_protocol(args.body_timeout),
    )
    return 0
