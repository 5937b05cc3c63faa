"""``pcd fit``: fit decision heads on labelled documents, gate them against the model's own decisions, and save them.

The labelled documents come from a table: a ``.jsonl``, ``.csv`` or ``.parquet`` file with a text column and one
column per field (named as the field; a multi-label field's cell a list of labels, or its JSON text in a CSV), or,
with ``--labels``, the documents of ``--input`` (any ``pcd tag`` input) joined by id with a table of labels, such as a
``pcd tag`` output a person corrected. An empty cell leaves that field unlabelled for that document. With ``--log``,
they are the requests a ``pcd serve --log`` server decided and got outcomes for (``POST /api/outcomes``), of the
schema given, or of the one schema or question set they share (``--served NAME``: those that named a served head).
With ``--decisions``, they are decision cases (requests of ``/v1/systemone`` or ``/v1/decisions`` with ``expected``
answers, :mod:`pcd_engine.questions.cases`), and the head is the head of their questions.

Each single-label field's held-out evidence gives the thresholds that reach target accuracies (printed, with their
coverage and interval; ``--accuracy`` keeps them with the head as its abstention thresholds) and, with
``--risk-plot``, a risk-coverage plot.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pcd_engine.errors import InputError, OptionError
from pcd_engine.schema import FieldSpec, Schema
from pcd_engine.tools.cli import common
from pcd_engine.tools.cli.trust import add_trust_flags, check_trust_flags, show_thresholds, write_risk_plot
from pcd_engine.tools.terminal import chunk_sizes, progress, show_table

__all__ = ["add", "cmd_fit", "fit_examples", "labelled_examples"]


def add(sub: Any) -> None:
    p = sub.add_parser("fit", help="fit decision heads on labelled documents (--input), gated against the model")
    common.with_model(p)
    p.add_argument("--schema", metavar="S.json", help="JSON Schema or preset dict")
    p.add_argument("--preset", metavar="PRESET", help="example preset name or preset .json file (instead of --schema)")
    p.add_argument("--input", default=None, help="labelled documents (.jsonl, .csv, .parquet), or with --labels any "
                   "pcd tag input")  # fmt: skip
    p.add_argument("--log", default=None, metavar="LOG.jsonl", help="instead of --input: a pcd serve --log file's "
                   "requests that have outcomes (their schema, unless --schema names one)")  # fmt: skip
    p.add_argument("--served", default=None, metavar="NAME", help="with --log: the requests that named this served "
                   "head")  # fmt: skip
    p.add_argument("--decisions", default=None, metavar="CASES.jsonl", help="instead of --input and --schema: "
                   "decision cases (a /v1/systemone or /v1/decisions request with 'expected' answers "
                   "per line)")  # fmt: skip
    p.add_argument(
        "--labels", default=None, metavar="TABLE", help="a table of labels by id (a corrected pcd tag output)"
    )
    p.add_argument("--text-column", default="text", help="the column holding the text (default: text)")
    p.add_argument("--id-column", default=None, help="with --labels: the input's id column (default: row number)")
    p.add_argument("--field", action="append", default=None, help="fit this field only (repeatable; default: every "
                   "single-choice field with a column)")  # fmt: skip
    p.add_argument("--limit", type=common.count, default=None, help="read only the first N labelled documents")
    p.add_argument("--require-better", action="store_true", help="fail unless every head beats the model's own answer")
    p.add_argument("-o", "--output", required=True, metavar="HEAD.json", help="where to write the head")
    add_trust_flags(p, keep=True)
    common.with_decoding(p)
    p.set_defaults(func=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    from pcd_engine.heads.head import FIT_CHUNK, Head

    if args.head:
        raise OptionError("pcd fit: expected no --head: it fits a new one.")
    output = common.check_output(args.output)
    check_trust_flags(args)
    schema, examples = fit_examples(args)
    options = common.extract_options(args)
    engine = common.load_engine(args)
    sizes = chunk_sizes(len(examples), FIT_CHUNK)
    with progress(len(examples), quiet=args.quiet, unit="doc", sizes=sizes) as tick:
        head = Head.fit(engine, schema, examples, fields=args.field, options=options, progress=tick,
                        require_better=args.require_better)  # fmt: skip
    if args.accuracy is not None:
        head = head.with_thresholds(accuracy=args.accuracy)
    path = head.save(output)
    folded = max((g.folded for g in head.gates), default=0)
    copies = f", {folded} copies folded" if folded else ""
    print(f"head of {schema.title!r} for {engine.model_id} ({len(examples)} labelled documents{copies}): {path}")
    show_table(
        ("field", "held out", "head accuracy", "model's accuracy", "gain, points (95% interval)", "head macro-F1",
         "head ECE (unscaled)", "better"),
        [(g.field, str(g.held_out), f"{g.head.accuracy:.1%}", f"{g.zero_shot.accuracy:.1%}",
          f"{g.gain * 100:+.1f} ({g.interval[0] * 100:+.1f} to {g.interval[1] * 100:+.1f})", f"{g.head.macro_f1:.2f}",
          f"{g.head.ece:.3f}" + (f" ({g.unscaled.ece:.3f})" if g.unscaled is not None else ""),
          "yes" if g.better else "no") for g in head.gates],
    )  # fmt: skip
    evidence = {f.name: f.held_out for f in head.fields}
    show_thresholds(evidence, extra=args.accuracy)
    if args.accuracy is not None:
        kept = {f.name: f.min_probability for f in head.fields if f.min_probability is not None}
        print(f"\nkept with the head for {args.accuracy:.0%}: " + ", ".join(f"{n} abstains below {p:.3f}"
                                                                         for n, p in kept.items()))  # fmt: skip
    write_risk_plot(args, evidence, title=f"Heads of {schema.title!r}, held-out examples ({engine.model_id})")
    return 0


def fit_examples(args: argparse.Namespace) -> tuple[Schema, list[tuple[str, Any]]]:
    """The schema and the labelled examples ``pcd fit`` reads: decision cases (``--decisions``), a log's requests
    with outcomes (``--log``, its schema unless ``--schema`` or ``--preset`` names one), or a table
    (:func:`labelled_examples`); all read before the model loads.

    Raises:
        OptionError: For sources given together, or ``--served`` without ``--log``.
        InputError: If a source cannot be read or holds no labelled examples.
    """
    from pcd_engine.questions import read_decision_cases
    from pcd_engine.tools.serve.outcomes import logged_examples

    if args.served is not None and args.log is None:
        raise OptionError("--served: expected it with --log (it picks a served head's requests from a log).")
    if args.log is not None and args.input is not None:
        raise OptionError("pcd fit: expected exactly one of --input and --log.")
    if args.decisions is not None:
        given = [f for f, v in (("--schema", args.schema), ("--preset", args.preset), ("--input", args.input),
                                ("--log", args.log), ("--labels", args.labels)) if v]  # fmt: skip
        if given:
            raise OptionError(f"--decisions: expected it alone (its cases carry their questions), but got {given[0]} "
                              "too.")  # fmt: skip
        cases = read_decision_cases(args.decisions)
        examples = [(text, dict(expected)) for text, expected in cases.examples]
        return cases.schema, examples[: args.limit] if args.limit else examples
    if args.log is not None and not (args.schema or args.preset):
        schema, found = logged_examples(args.log, served=args.served)
    else:
        schema = common.read_schema(args)
        if args.log is None:
            return schema, labelled_examples(args, schema)
        found = logged_examples(args.log, schema, served=args.served)[1]
    if not found:
        raise InputError(f"Log {args.log!r}: expected requests of {schema.title!r} with outcomes, but found none.")
    return schema, found[: args.limit] if args.limit else found


def labelled_examples(args: argparse.Namespace, schema: Schema) -> list[tuple[str, dict[str, Any]]]:
    """The ``(text, {field: value})`` examples ``pcd fit`` reads (see the module docstring), each cell read as the
    field's label (a CSV's ``true`` as a boolean's ``True``, ``3`` as an integer label).

    Raises:
        InputError: If a file cannot be read, a column is missing, or no document is labelled.
    """
    from pcd_engine.heads.head import HEADED_KINDS
    from pcd_engine.tagging.corpus import read_corpus, read_records

    if args.input is None:
        raise OptionError("pcd fit: expected one of --input, --log and --decisions.")
    headed = {s.name: s for s in schema.fields if s.kind in HEADED_KINDS and len(s.labels) > 1}
    rows: list[tuple[str, Any, Mapping[str, Any]]] = []  # (where, text, row)
    if args.labels is None:
        for where, record in read_records(args.input):
            row: Mapping[str, Any] = record
            if args.text_column not in row:
                raise InputError(f"Input {where}: expected a text column {args.text_column!r}, but got {sorted(row)}.")
            rows.append((where, row[args.text_column], row))
    else:
        docs = {d.id: d for d in read_corpus(args.input, text_column=args.text_column, id_column=args.id_column)}
        for where, row in read_records(args.labels, what="Labels"):
            key = row.get("id")
            key = key if isinstance(key, str) or key is None else json.dumps(key)
            if key not in docs:
                raise InputError(f"Labels {where}: expected the id of a document of --input, but got {key!r}.")
            rows.append((where, docs[key].text, row))
    fields = args.field or [name for name in headed if any(name in row for _, _, row in rows)]
    examples = []
    for where, text, row in rows:
        labels = {n: _label(headed[n], row[n]) for n in fields if n in headed and row.get(n) not in (None, "")}
        if labels and isinstance(text, str) and text.strip():
            examples.append((text, labels))
        elif labels:
            raise InputError(f"Input {where}: expected a text, but got {text!r}.")
    if not examples:
        raise InputError(f"Input {args.input!r}: expected documents labelled in a column of {list(headed)}, but "
                         "found none.")  # fmt: skip
    return examples[: args.limit] if args.limit else examples


def _label(spec: FieldSpec, cell: Any) -> Any:
    """A table cell as one of ``spec``'s labels where it spells one (``"true"``, ``"3"``); a multi-label field's cell
    as a list of them (a list, or its JSON text in a CSV cell); else the cell, which the fit then refuses by name."""
    if spec.kind == "multi":
        if isinstance(cell, str) and cell.strip().startswith("["):
            try:
                cell = json.loads(cell)
            except json.JSONDecodeError:
                return cell
        return [_label(replace(spec, kind="enum"), item) for item in cell] if isinstance(cell, list) else cell
    values: Sequence[Any] = [label.value for label in spec.labels]
    if any(cell == v and type(cell) is type(v) for v in values) or not isinstance(cell, str):
        return cell
    spelled = cell.strip()
    for v in values:
        if spelled == str(v) or spelled == json.dumps(v) or (isinstance(v, bool) and spelled.lower() == str(v).lower()):
            return v
    return cell
