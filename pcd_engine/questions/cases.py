"""Decision cases: requests of a decision route with the answers they should get, the labelled examples a head of
those questions is fitted on (``pcd fit --decisions``).

A cases file is JSON lines, one case per line, in either route's shape:

* ``/v1/systemone``: ``{"state": ..., "questions": {NAME: {"type": "noul" | "choice" | "score", ...}},
  "expected": {NAME: answer}}``;
* ``/v1/decisions``: ``{"input": ..., "questions": [{"name": NAME, "type": "predicate" | ...}], "expected": ...}``.

The lines of one file share their questions: the first line names them, a later line repeats them or leaves them out.
An expected answer is what its question's type takes (:meth:`~pcd_engine.questions.kinds.QuestionType.expected`): a
label for a choice, ``true``/``false`` (or 1/0) for a yes/no question, a level's number or name for a score; a case
may leave a question out (it is then not used for that question).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcd_engine.errors import ContextError, InputError, QuestionError
from pcd_engine.jsonl import json_lines
from pcd_engine.prompt.transcript import responses_input
from pcd_engine.questions.asking import Question, questions_schema
from pcd_engine.questions.kinds import wire_type
from pcd_engine.questions.states import state_text
from pcd_engine.schema import LabelValue, Schema

__all__ = ["DecisionCases", "read_decision_cases", "wire_questions"]


@dataclass(frozen=True)
class DecisionCases:
    """The cases of one file: their shared questions and each case's text with its expected answers.

    Attributes:
        questions: The questions, by name, in the order the first case asks them.
        wire: The route whose shape the cases take (``"systemone"`` or ``"decisions"``).
        examples: ``(text, {name: value})`` per case, each value one of its question's field values (what
            :meth:`~pcd_engine.heads.head.Head.fit` takes for :attr:`schema`).
    """

    questions: Mapping[str, Question]
    wire: str
    examples: tuple[tuple[str, Mapping[str, LabelValue]], ...]

    @property
    def schema(self) -> Schema:
        """The schema that asks :attr:`questions` (:func:`~pcd_engine.questions.questions_schema`)."""
        return questions_schema(self.questions)


def wire_questions(raw: Any, where: str) -> tuple[dict[str, Question], str]:
    """A request's questions in either route's shape: a ``/v1/systemone`` object by name or a ``/v1/decisions``
    list; with the route's name.

    Raises:
        QuestionError: Naming the question (or its part) at fault.
    """
    asked: dict[str, Question] = {}
    if isinstance(raw, dict) and raw:
        for name, item in raw.items():
            at = f"{where}.{name}"
            kind = wire_type("systemone", item.get("type") if isinstance(item, dict) else None, where=at)
            asked[name] = Question.from_wire(kind, "systemone", item, at)
        return asked, "systemone"
    if isinstance(raw, list) and raw:
        for i, item in enumerate(raw):
            name, question = Question.named_from_decisions(item, f"{where}[{i}]")
            if name in asked:
                raise QuestionError(f"{where}[{i}].name: {name!r} is used twice.", param=f"{where}[{i}].name")
            asked[name] = question
        return asked, "decisions"
    message = f"{where}: expected questions (an object by name, or a list), but got {raw!r}."
    raise QuestionError(message, param=where)


def read_decision_cases(path: str | os.PathLike[str]) -> DecisionCases:
    """The cases of a JSON-lines file (see the module docstring), every line checked.

    Raises:
        InputError: If the file cannot be read, or a line is not a case of the first line's questions, naming the
            line and what is wrong.
    """
    file = Path(path)
    if not file.is_file():
        raise InputError(f"Cases {str(path)!r}: expected a JSON-lines file of decision cases, but there is none.")
    questions: dict[str, Question] | None = None
    wire = ""
    examples: list[tuple[str, Mapping[str, LabelValue]]] = []
    for where, case in json_lines(file, what="Cases"):
        try:
            if "questions" in case:
                asked, shape = wire_questions(case["questions"], "questions")
                questions_schema(asked)  # each question checked, naming it
                if questions is None:
                    questions, wire = asked, shape
                elif asked != questions:
                    raise InputError(f"Cases {where}: expected the questions of the first case {list(questions)}, "
                                     f"but got other questions {list(asked)}.")  # fmt: skip
            elif questions is None:
                raise InputError(f"Cases {where}: expected the first case to name its questions.")
            examples.append((_case_text(case), _expected(case.get("expected"), questions)))
        except (QuestionError, ContextError) as exc:
            raise InputError(f"Cases {where}: {exc}") from None
    if questions is None:
        raise InputError(f"Cases {str(path)!r}: expected at least one case, but the file has none.")
    return DecisionCases(questions, wire, tuple(examples))


def _case_text(case: Mapping[str, Any]) -> str:
    """A case's state (``state``) or input (``input``) as the text its questions are decided on.

    Raises:
        ContextError: If it has neither, or it cannot be read.
    """
    if "state" in case:
        return state_text(case["state"], where="state")
    if "input" in case:
        raw = case["input"]
        return raw if isinstance(raw, str) else state_text(responses_input(raw, where="input"), where="input")
    raise ContextError(f"expected a 'state' (or an 'input'), but got {sorted(case)}.")


def _expected(raw: Any, questions: Mapping[str, Question]) -> dict[str, LabelValue]:
    """A case's expected answers as field values, each checked by its question's type.

    Raises:
        QuestionError: For a name that is no question, or an answer its question cannot give.
    """
    if not isinstance(raw, dict) or not raw:
        raise QuestionError(f"expected: expected answers by question name, but got {raw!r}.", param="expected")
    out = {}
    for name, answer in raw.items():
        if name not in questions:
            message = f"expected.{name}: expected a question of {list(questions)}, but got {name!r}."
            raise QuestionError(message, param=f"expected.{name}")
        question = questions[name]
        out[name] = question.type.expected(question, answer, f"expected.{name}")
    return out
