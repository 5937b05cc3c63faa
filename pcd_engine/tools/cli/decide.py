"""``pcd decide``: answer typed questions about states from the shell, as ``/v1/decisions`` answers them.

The questions come from shorthand flags (``--noul NAME=INSTRUCTIONS``, ``--choice NAME=a,b,c``,
``--score NAME=low,mid,high``) or a ``/v1/decisions`` questions file (``--questions``), or both; the states from
``--state TEXT``, ``--state-file F`` or ``--states FILE.jsonl`` (one ``{"state": ...}`` request per line). One
state prints a table of every answer's probabilities as bars (``--json``: its response body); a JSON-lines file
prints one response body per line, in order, a line that cannot be answered an error body naming its line, and the
run goes on (exit 1 at the end when any line failed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from pcd_engine.errors import InputError, OptionError, PCDError
from pcd_engine.tools.cli import common
from pcd_engine.tools.terminal import read_json, read_text, shorten, show_table

__all__ = ["BATCH", "add", "answer_body", "cmd_decide", "shorthand_questions"]

BATCH = 32
"""States decided per engine call from a JSON-lines file (their answers print before the next call)."""
BAR = 24
"""Width of a probability bar at 1.0, in characters."""


def add(sub: Any) -> None:
    p = sub.add_parser("decide", help="answer yes/no, choice and score questions about a state, with probabilities")
    common.with_model(p)
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--state", metavar="TEXT", help="the state itself")
    given.add_argument("--state-file", metavar="F", help="a file holding the state: text, or JSON ('-' for stdin)")
    given.add_argument("--states", metavar="FILE.jsonl", help='one {"state": ...} per line; one answer body each')
    p.add_argument("--noul", action="append", default=[], metavar="NAME=INSTRUCTIONS", help="a yes/no question")
    p.add_argument("--choice", action="append", default=[], metavar="NAME=a,b,c", help="one label of several")
    p.add_argument("--score", action="append", default=[], metavar="NAME=low,mid,high", help="a level, lowest first")
    p.add_argument("--questions", metavar="Q.json", help="questions as /v1/decisions takes them (a list)")
    p.add_argument("--json", action="store_true", help="print the response body instead of a table")
    common.with_decoding(p)
    p.set_defaults(func=cmd_decide)


def shorthand_questions(args: argparse.Namespace) -> dict[str, Any]:
    """The questions of ``--questions`` and the shorthand flags, in that order: ``--noul NAME=INSTRUCTIONS`` asks
    the instructions as a yes/no question; ``--choice NAME=a,b,c`` asks "Which NAME?" with those labels;
    ``--score NAME=low,mid,high`` asks "How much NAME?" on those levels, lowest first.

    Raises:
        OptionError: If a flag is not ``NAME=...``, a name is used twice, or there are no questions.
        QuestionError: If the questions file holds a question pcd cannot ask (naming it).
    """
    from pcd_engine.questions import Question

    questions: dict[str, Question] = {}

    def put(name: str, question: Question, flag: str) -> None:
        if name in questions:
            raise OptionError(f"{flag}: expected each question name once, but {name!r} is asked twice.")
        questions[name] = question

    if args.questions:
        raw = read_json(args.questions, "Questions")
        if not isinstance(raw, list) or not raw:
            got = type(raw).__name__ if raw else "an empty list"
            raise OptionError(f"--questions: expected a non-empty JSON list of questions, but got {got}.")
        for i, item in enumerate(raw):
            put(*Question.named_from_decisions(item, f"questions[{i}]"), "--questions")
    for flag, given in (("--noul", args.noul), ("--choice", args.choice), ("--score", args.score)):
        for text in given:
            name, sep, rest = text.partition("=")
            name, rest = name.strip(), rest.strip()
            if not sep or not name or not rest:
                raise OptionError(f"{flag}: expected NAME=..., but got {text!r}.")
            if flag == "--noul":
                put(name, Question.yes_no(rest), flag)
                continue
            items = [item.strip() for item in rest.split(",") if item.strip()]
            if len(items) < 2:
                raise OptionError(f"{flag} {name}: expected at least two comma-separated values, but got {rest!r}.")
            words = name.replace("_", " ")
            made = Question.choice(f"Which {words}?", items) if flag == "--choice" else None
            put(name, made or Question.score(f"How much {words}?", items), flag)
    if not questions:
        raise OptionError("pcd decide: expected questions (--noul, --choice, --score or --questions), but got none.")
    return questions


def answer_body(decided: Any) -> dict[str, Any]:
    """One state's answers as ``pcd decide`` prints them: per question its value, every answer's probability (as
    ``[value, probability]`` pairs, in the question's order) and the distribution's confidence."""
    return {
        name: {
            "value": a.value,
            "probabilities": [[v, p] for v, p in a.probabilities.items()],
            "confidence": a.confidence,
        }
        for name, a in decided.answers.items()
    }


def cmd_decide(args: argparse.Namespace) -> int:
    from pcd_engine.questions import decide_questions, questions_schema

    questions = shorthand_questions(args)
    questions_schema(questions)  # every question checked before the model loads
    options = common.extract_options(args)
    if args.states is None:
        state = args.state if args.state is not None else _state_file(args.state_file)
        engine = common.load_engine(args)
        (decided,) = decide_questions(engine, [state], questions, options=options)
        if args.json:
            print(json.dumps({"answers": answer_body(decided)}, ensure_ascii=False))
            return 0
        print(f"state: {shorten(state if isinstance(state, str) else json.dumps(state, ensure_ascii=False))}\n")
        rows = [
            (name if k == 0 else "", _shown(value, questions[name].descriptions, k), f"{p:.3f}", "█" * round(p * BAR))
            for name, a in decided.answers.items()
            for k, (value, p) in enumerate(a.probabilities.items())
        ]
        show_table(("question", "answer", "probability", ""), rows)
        return 0
    lines = list(_lines(args.states))  # the file is read whole before the model loads
    engine = common.load_engine(args)
    failed = 0
    for first in range(0, len(lines), BATCH):
        chunk = lines[first : first + BATCH]
        readable = [(n, state) for n, state in chunk if not isinstance(state, PCDError)]
        decided = iter(decide_questions(engine, [s for _, s in readable], questions, options=options,
                                        return_exceptions=True))  # fmt: skip
        for n, state in chunk:
            got = state if isinstance(state, PCDError) else next(decided)
            if isinstance(got, Exception):
                failed += 1
                print(json.dumps({"line": n, "error": str(got)}, ensure_ascii=False))
            else:
                print(json.dumps({"line": n, "answers": answer_body(got)}, ensure_ascii=False))
        sys.stdout.flush()
    if failed:
        raise InputError(f"--states: {failed} of {len(lines)} lines could not be answered (their error bodies say why)")
    return 0


def _shown(value: Any, descriptions: tuple[str | None, ...], k: int) -> str:
    """An answer as its table row names it: the value, and what it means where the question says (a score's
    level name, a choice's description)."""
    meaning = descriptions[k] if k < len(descriptions) else None
    return str(value) if not meaning or meaning == str(value) else f"{value} ({shorten(meaning, 40)})"


def _state_file(path: str) -> Any:
    """A state file's state: its JSON when it parses as a JSON object or array, else its text."""
    text = read_text(path, "State")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text
    return parsed if isinstance(parsed, (dict, list)) else text


def _lines(path: str) -> Iterator[tuple[int, Any]]:
    """``(line number, state)`` for every non-blank line of a JSON-lines file; a line that is not a
    ``{"state": ...}`` object gives its error (an :class:`InputError` naming the line) in place of the state."""
    for n, line in enumerate(read_text(path, "States").splitlines(), 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, InputError(f"line {n}: expected a JSON object, but {exc.msg} at column {exc.colno}.")
            continue
        if not isinstance(body, dict) or "state" not in body:
            got = sorted(body) if isinstance(body, dict) else type(body).__name__
            yield n, InputError(f'line {n}: expected an object with a "state", but got {got}.')
            continue
        yield n, body["state"]
