"""``pcd serve``: the web page and the OpenAI-compatible server on loopback, over HTTPS when given a certificate."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from typing import TYPE_CHECKING, Any

from pcd_engine.errors import BackendUnavailableError, InputError, OptionError, check_count, pip_install
from pcd_engine.limits import SERVER_LIMITS, SERVER_MAX_NEW_TOKENS, RequestLimits
from pcd_engine.models.resolve import DEFAULT_MODEL
from pcd_engine.options import check_batch_size
from pcd_engine.tools.cli import common

if TYPE_CHECKING:
    pass


__all__ = ["add", "cmd_serve", "tls_files"]


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
    p.add_argument("--log", default=None, metavar="LOG.jsonl", help="append every decided request and the outcomes "
                   "POST /api/outcomes reports (pcd fit --log and pcd promote read them)")  # fmt: skip
    p.add_argument("--head", action="append", default=[], metavar="NAME=FILE", help="serve a fitted head as model "
                   "NAME (repeatable; a folder serves each NAME.head.json in it)")  # fmt: skip
    p.add_argument("--shadow", action="append", default=[], metavar="NAME=FILE", help="decide with this candidate "
                   "head beside head NAME and log its decision (needs --log; pcd promote compares them)")  # fmt: skip
    p.add_argument("--ssl-certfile", default=None, metavar="CERT.pem",
                   help="serve HTTPS with this certificate (its chain after it); with --ssl-keyfile")  # fmt: skip
    p.add_argument("--ssl-keyfile", default=None, metavar="KEY.pem", help="the certificate's private key")
    p.add_argument("--ssl-keyfile-password", default=None, metavar="PASSWORD", help="the key's password, if any")
    p.set_defaults(func=cmd_serve)


def tls_files(args: argparse.Namespace) -> tuple[str, str, str | None] | None:
    """``(certfile, keyfile, key password)`` for uvicorn from ``--ssl-certfile`` and ``--ssl-keyfile`` (both or
    neither; ``None``: plain HTTP), the files checked to load as a certificate and its key before the model does.

    Raises:
        InputError: If one is given without the other, a file is missing, or they do not load as a pair.
    """
    cert, key = args.ssl_certfile, args.ssl_keyfile
    if cert is None and key is None:
        if args.ssl_keyfile_password is not None:
            raise InputError("--ssl-keyfile-password: expected it with --ssl-certfile and --ssl-keyfile.")
        return None
    if cert is None or key is None:
        given, missing = ("--ssl-certfile", "--ssl-keyfile") if key is None else ("--ssl-keyfile", "--ssl-certfile")
        raise InputError(f"{given}: expected it with {missing} (HTTPS needs both), but got it alone.")
    for flag, path in (("--ssl-certfile", cert), ("--ssl-keyfile", key)):
        if not os.path.isfile(path):
            raise InputError(f"{flag}: expected a PEM file, but {path!r} is not a file.")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key, args.ssl_keyfile_password)
    except (ssl.SSLError, OSError) as exc:
        raise InputError(
            f"--ssl-certfile/--ssl-keyfile: expected a PEM certificate and its private key, but loading "
            f"{cert!r} with {key!r} failed: {exc}."
        ) from None
    return cert, key, args.ssl_keyfile_password


def cmd_serve(args: argparse.Namespace) -> int:
    from pcd_engine.tools.serve import create_app, header_timeout_protocol
    from pcd_engine.tools.serve.served import served_heads

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
    tls = tls_files(args)
    check_count(args.max_new_tokens, "pcd serve --max-new-tokens")
    if args.shadow and not args.log:
        raise OptionError("--shadow: expected --log too (a shadow's decisions go to the log), but got no --log.")
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
    aliases = model_names(args.model, resolved)  # every name `pcd models` lists for it
    heads = served_heads(args.head, args.shadow, model_id=engine.model_id,
                         taken=[args.name or args.model, *aliases, "default"])  # fmt: skip
    app = create_app(
        engine,
        model_name=args.name or args.model,
        max_new_tokens=args.max_new_tokens,
        limits=limits,
        body_timeout_s=args.body_timeout,
        host=args.host,
        allowed_hosts=args.allow_host,
        aliases=aliases,
        api_key=api_key,
        cors_origins=args.cors_origin,
        batch_window_ms=None if args.batch_window < 0 else args.batch_window,
        max_batch=args.max_batch,
        log=args.log,
        heads=heads,
    )
    if not args.quiet:
        scheme = "http" if tls is None else "https"
        print(f"pcd: serving {args.model} on {scheme}://{args.host}:{args.port}/ (OpenAI API at /v1)", file=sys.stderr)
        for name, served in heads.items():
            shadow = f", shadowed by {served.shadow_path}" if served.shadow_path else ""
            print(f"pcd: serving head {served.path} as model {name!r}{shadow}", file=sys.stderr)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning" if args.quiet else "info",
        http=header_timeout_protocol(args.body_timeout),
        ssl_certfile=None if tls is None else tls[0],
        ssl_keyfile=None if tls is None else tls[1],
        ssl_keyfile_password=None if tls is None else tls[2],
    )
    return 0
