"""Typed questions decided together: the engine's side of the decision-model interfaces.

:mod:`~pcd_engine.questions.asking` turns questions into one schema and reads their answers back
(:func:`decide_questions` does both for a batch of states in one engine call); :mod:`~pcd_engine.questions.kinds`
holds the question types, one object each (yes/no, choice, score), which own what differs between kinds (the
closed field, the answer's reading, each wire format); :mod:`~pcd_engine.questions.states` turns a state (text,
JSON or a conversation) into the text it is decided on; :mod:`~pcd_engine.questions.cases` reads decision cases
(requests with their expected answers) as the examples a head of their questions is fitted on.
"""

from __future__ import annotations

from pcd_engine.questions.asking import (
    Decisions,
    Question,
    QuestionAnswer,
    QuestionKind,
    concentration,
    decide_questions,
    questions_schema,
    read_decisions,
)
from pcd_engine.questions.cases import DecisionCases, read_decision_cases, wire_questions
from pcd_engine.questions.kinds import CHOICE, SCORE, TYPES, YES_NO, QuestionType, wire_type
from pcd_engine.questions.states import content_text, state_text

__all__ = [
    "CHOICE",
    "SCORE",
    "TYPES",
    "YES_NO",
    "DecisionCases",
    "Decisions",
    "Question",
    "QuestionAnswer",
    "QuestionKind",
    "QuestionType",
    "concentration",
    "content_text",
    "decide_questions",
    "questions_schema",
    "read_decision_cases",
    "read_decisions",
    "state_text",
    "wire_questions",
    "wire_type",
]
