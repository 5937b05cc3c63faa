"""A call's options: :class:`ExtractOptions` (and :class:`PromptFormat`, the part that changes the prompt and so
keys the schema's cached preamble). They are checked on construction, laid over the engine's defaults field by field
(:meth:`ExtractOptions.over`), and resolve the call's one decider (:attr:`ExtractOptions.decider`)."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

from pcd_engine.deciders import Decider, decider_for
from pcd_engine.deciders.corrections import CORRECTIONS as _CORRECTIONS
from pcd_engine.deciders.corrections import NoCorrection, correction_named
from pcd_engine.errors import InputError, OptionError, check_count
from pcd_engine.limits import RequestLimits
from pcd_engine.schema import FieldSpec

__all__ = ["CORRECTIONS", "STAGINGS", "STRATEGIES", "STRATEGY_ALIASES", "ExtractOptions", "PromptFormat"]

STRATEGIES = ("marginal", "exact", "trie_walk")
# How a wave's tree is read (see pcd_engine.decide.staging): the cost model's choice, always whole, or always staged.
STAGINGS = ("auto", "one_pass", "staged")
# How a call corrects the model's label lean without a fitted calibration: the names of
# pcd_engine.deciders.corrections's objects, which own what each one means.
CORRECTIONS = tuple(_CORRECTIONS)
# The first pcd's strategy names. "auto" lets the engine choose per field (marginal up to marginal_max_labels
# labels, the trie walk above); "first_token" was the marginal of the first token where labels differ; "trie" and
# "greedy" walked the trie greedily. "hybrid" has no counterpart and is refused with the nearest real name.
STRATEGY_ALIASES: Mapping[str, str | None] = {
    "auto": None,
    "first_token": "marginal",
    "trie": "trie_walk",
    "greedy": "trie_walk",
}


@dataclass(frozen=True)
class PromptFormat:
    """How the instructions are written (a field of the cache key of a schema's preamble).

    Attributes:
        instructions: Text that replaces pcd's own instruction sentence ("Read the user's text and answer with one
            JSON object..."); ``None`` keeps it.
        list_choices: List each closed field's allowed values in the instructions. Off, the model sees only the
            keys and descriptions (the labels are still the only answers it can give).
        quoted_booleans: Write booleans as ``"true"`` / ``"false"`` in the instructions and in the answers written
            into the prompt; both spellings are scored either way.
        chat_template_kwargs: Extra keyword arguments for the tokenizer's ``apply_chat_template``, as sorted
            ``(name, value)`` pairs.
    """

    instructions: str | None = None
    list_choices: bool = True
    quoted_booleans: bool = False
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        """A stable text key of the format (empty for the default format)."""
        if self == PromptFormat():
            return ""
        return repr((self.instructions, self.list_choices, self.quoted_booleans, self.chat_template_kwargs))


@dataclass(frozen=True)
class ExtractOptions:
    """A call's settings; ``None`` keeps the engine's default for that field.

    Attributes:
        strategy: ``"marginal"``, ``"exact"`` or ``"trie_walk"`` for every field with several labels, or ``None``
            / ``"auto"`` for the engine's choice; the aliases of :data:`STRATEGY_ALIASES` are accepted.
        temperature: Reshapes the reported probabilities (> 0); never changes the decisions.
        staging: How the ``exact`` and ``trie_walk`` fields of a wave are read: ``"auto"`` lets the cost model
            choose, ``"one_pass"`` reads every label's tokens in one pass, ``"staged"`` reads the labels'
            identifying tokens first and then only the tails of the labels that can still win (see
            :mod:`pcd_engine.decide.staging`; the decisions are the same either way).
        anchor: Decide the first closed field alone and write it into the prompt before the others.
        max_tokens: The most tokens generated for one open field's value (a field's own ``x-max-tokens`` wins).
        draft_tokens: The most tokens an open row proposes from the document per pass, checked in the row's own
            pass (0 turns drafting off; the values are the same either way, see :mod:`pcd_engine.generate.drafting`).
        memory_budget_mb: The estimated peak memory of one pass, in MiB.
        instructions: See :class:`PromptFormat`.
        list_choices: See :class:`PromptFormat`.
        quoted_booleans: See :class:`PromptFormat`.
        chat_template_kwargs: See :class:`PromptFormat` (a mapping is accepted and stored as sorted pairs).
        limits: Per-request limits (labels, generated tokens, time).
        calibration: A :class:`~pcd_engine.calibrate.calibrator.Calibrator` fitted on this schema and model (or its JSON
            data): each closed field's label distribution is corrected for the model's label prior, and the
            decision follows the corrected one (results keep the raw probability too). Its fields are read
            whole (``staging="one_pass"``; the trie walk becomes ``"exact"``), so every label has a probability.
        min_probability: Abstain below this probability (in ``(0, 1]``; calibrated when a calibration is set): a
            scored field whose probability is lower is marked ``abstained`` and named in the warnings, and an
            Optional field answers ``None`` instead of its best label (whose probability stays in
            ``alternatives``). A non-Optional field keeps its best label, flagged. Later waves were decided
            with the best label written, as without the option. Without it, a head's own thresholds are used where
            it keeps them (:meth:`~pcd_engine.heads.head.Head.with_thresholds`).
        prediction_set: A level in ``(0, 1)`` (e.g. 0.9): each scored single-label field with held-out evidence (one
            a ``head`` decides) also answers the smallest set of labels that holds the true one with at least that
            probability (:attr:`~pcd_engine.result.evidence.FieldResult.prediction_set`, split conformal); the
            others are named in a warning.
        label_orders: Read each document with every single-label closed field's labels in this many orders (the
            schema's, its reverse, then shifts of both; at most 8) and decide each such field by the mean of their
            distributions, so that the answer does not follow where a label was listed (:mod:`pcd_engine.run.orders`).
            The orders share their passes (one pass per wave for all of them); each costs its own prefill and rows.
            Not with a ``head`` or ``calibration`` (each is fitted on one order). ``None`` or 1: the schema's order.
        correction: How the model's label lean is divided out when no ``calibration`` is given: the name of one
            of :data:`CORRECTIONS` (each is an object of :mod:`pcd_engine.deciders.corrections`, which says what it
            reads and where its lean comes from). ``"auto"`` (the engine's default) divides out the lean read on
            content-free inputs from the single-choice fields a plain call reads whole, so an answer never depends
            on the other documents of a call; ``"content_free"`` does so for every closed field, read whole;
            ``"batch"`` estimates the lean on the documents one caller decides together, assuming their labels
            are about equally common; ``"none"`` keeps the model's own distributions. A ``calibration`` wins.
        head: A :class:`~pcd_engine.heads.head.Head` fitted on this schema and model (or its JSON data, or the
            path of a saved head): each field it has a head for is decided by the head, from hidden states of the
            same passes (no extra forward pass); the result keeps the model's own distribution beside the head's.
            The other fields are decided as without it. The call reads every closed field whole.

    Raises:
        OptionError: On construction, if a value has the wrong type or is out of range.
    """

    strategy: str | None = None
    temperature: float | None = None
    staging: str | None = None
    anchor: bool | None = None
    max_tokens: int | None = None
    draft_tokens: int | None = None
    memory_budget_mb: float | None = None
    instructions: str | None = None
    list_choices: bool | None = None
    quoted_booleans: bool | None = None
    chat_template_kwargs: Any = None
    limits: RequestLimits | None = None
    calibration: Any = None
    min_probability: float | None = None
    prediction_set: float | None = None
    label_orders: int | None = None
    correction: str | None = None
    head: Any = None

    def __post_init__(self) -> None:
        if self.strategy is not None:
            object.__setattr__(self, "strategy", _strategy(self.strategy))
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise OptionError(f"temperature: expected a number > 0, but got {t!r}.")
        if t is not None and not math.isfinite(t):
            raise OptionError(f"temperature: expected a finite number, but got {t!r}.")
        if self.staging is not None and self.staging not in STAGINGS:
            raise OptionError(f"staging: expected one of {list(STAGINGS)}, but got {self.staging!r}.")
        if self.correction is not None:
            correction_named(self.correction)  # refuses an unknown name
        for name in ("anchor", "list_choices", "quoted_booleans"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise OptionError(f"{name}: expected true or false, but got {value!r}.")
        check_count(self.max_tokens, "max_tokens")
        check_count(self.draft_tokens, "draft_tokens", minimum=0)
        check_count(self.label_orders, "label_orders")
        if self.label_orders is not None and self.label_orders > MAX_LABEL_ORDERS:
            raise OptionError(f"label_orders: expected at most {MAX_LABEL_ORDERS} orders, but got {self.label_orders}.")
        m = self.memory_budget_mb
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise OptionError(f"memory_budget_mb: expected a positive number, but got {m!r}.")
        if self.instructions is not None and (not isinstance(self.instructions, str) or not self.instructions.strip()):
            raise OptionError(f"instructions: expected a non-empty string, but got {self.instructions!r}.")
        if self.chat_template_kwargs is not None:
            object.__setattr__(self, "chat_template_kwargs", _pairs(self.chat_template_kwargs))
        if self.limits is not None and not isinstance(self.limits, RequestLimits):
            raise OptionError(f"limits: expected a RequestLimits, but got {type(self.limits).__name__}.")
        _share("min_probability", self.min_probability, "a number in (0, 1]", one=True)
        _share("prediction_set", self.prediction_set, "a level in (0, 1) such as 0.9", one=False)
        if self.calibration is not None:
            from pcd_engine.calibrate.calibrator import Calibrator

            if isinstance(self.calibration, Mapping):
                try:
                    object.__setattr__(self, "calibration", Calibrator.from_json(self.calibration))
                except InputError as exc:  # given as an option, malformed data is a bad option
                    raise OptionError(f"calibration: {exc}") from None
            elif not isinstance(self.calibration, Calibrator):
                raise OptionError(
                    f"calibration: expected a Calibrator (or its JSON), but got {type(self.calibration).__name__}."
                )
        if self.head is not None:
            object.__setattr__(self, "head", _head(self.head))

    @cached_property
    def decider(self) -> Decider:
        """The one :class:`~pcd_engine.deciders.Decider` these options resolve to: the ``head`` (falling back to the
        rest) over the ``calibration``, which wins over the ``correction`` (``None``: ``"none"``)."""
        return decider_for(correction=self.correction, calibration=self.calibration, head=self.head)

    def thresholds(self, specs: Sequence[FieldSpec]) -> dict[str, tuple[float, str]]:
        """Each field's abstention threshold and what set it, in a warning's words: the call's ``min_probability``
        for every field, else its decider's own (a head's, :meth:`~pcd_engine.deciders.Decider.threshold`)."""
        if self.min_probability is not None:
            return {spec.name: (self.min_probability, f"min_probability {self.min_probability}") for spec in specs}
        found = {spec.name: self.decider.threshold(spec) for spec in specs}
        return {name: (p, f"the head's threshold {p:.3f}") for name, p in found.items() if p is not None}

    def set_cutoffs(self, specs: Sequence[FieldSpec]) -> dict[str, float]:
        """Each field's prediction-set cutoff at this call's ``prediction_set`` level, where its decider has held-out
        evidence (:meth:`~pcd_engine.deciders.Decider.set_cutoff`); empty without the option."""
        if self.prediction_set is None:
            return {}
        found = {spec.name: self.decider.set_cutoff(spec, self.prediction_set) for spec in specs}
        return {name: cutoff for name, cutoff in found.items() if cutoff is not None}

    @property
    def names_decider(self) -> bool:
        """Whether these options name how their fields are decided: a ``correction``, ``calibration`` or ``head``."""
        return any(v is not None for v in (self.correction, self.calibration, self.head))

    @property
    def reads_whole(self) -> bool:
        """Whether the call reads every closed field whole (:meth:`read_whole`), as its decider asks
        (:attr:`~pcd_engine.deciders.Decider.reads_whole`)."""
        return self.decider.reads_whole

    @property
    def value_tokens(self) -> int:
        """The call's token limit per open value (``max_tokens``; a field's own limit wins,
        :meth:`~pcd_engine.schema.FieldSpec.token_limit`); 1 on options not resolved over the engine's, which always
        set it."""
        return int(self.max_tokens or 1)

    def without_fitted(self, option: str, *, where: str) -> ExtractOptions:
        """These options, to fit a new ``option`` (``"calibration"`` or ``"head"``) with.

        Raises:
            OptionError: If they already carry one (``where`` names what is being fitted).
        """
        if getattr(self, option) is not None:
            raise OptionError(f"{where}: expected options without a {option} to fit a new one on.")
        return self

    def uncorrected(self) -> ExtractOptions:
        """These options deciding with the model's own distributions: no calibration, no head, no correction."""
        return replace(self, calibration=None, head=None, correction=NoCorrection.name)

    def read_whole(self) -> ExtractOptions:
        """These options with every closed field read whole (``staging="one_pass"``, the trie walk as
        ``"exact"``), so that each label has its full probability: how a calibrated or corrected call runs, and
        how a calibration is fitted."""
        strategy = "exact" if self.strategy in (None, "trie_walk") else self.strategy
        return replace(self, staging="one_pass", strategy=strategy)

    @classmethod
    def parse(cls, data: ExtractOptions | Mapping[str, Any] | None, *, where: str = "options") -> ExtractOptions:
        """Options from a surface's mapping (JSON, keyword arguments); an unknown name is refused.

        Args:
            data: A mapping of option names to values, an :class:`ExtractOptions`, or ``None``.
            where: What the mapping is called on its surface, for messages.

        Raises:
            OptionError: If a name is unknown (the message names the nearest known one) or a value is bad.
        """
        if data is None:
            return cls()
        if isinstance(data, ExtractOptions):
            return data
        if not isinstance(data, Mapping):
            raise OptionError(f"{where}: expected an object of option names to values, but got {type(data).__name__}.")
        known = [f.name for f in fields(cls)]
        for name in data:
            if name not in known:
                near = difflib.get_close_matches(str(name), known, n=1)
                hint = f" Did you mean {near[0]!r}?" if near else ""
                raise OptionError(f"{where}: unknown option {name!r}.{hint} Known options: {', '.join(known)}.")
        values = dict(data)
        if isinstance(values.get("limits"), Mapping):
            try:
                values["limits"] = RequestLimits(**values["limits"])
            except TypeError as exc:
                raise OptionError(f"{where}.limits: {exc}.") from None
        return cls(**values)

    def over(self, base: ExtractOptions) -> ExtractOptions:
        """These options laid over ``base``: every field set here wins, the others come from ``base``."""
        changes = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return replace(base, **changes)

    def set_fields(self) -> dict[str, Any]:
        """The fields that are set (not ``None``), by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def prompt_format(self) -> PromptFormat:
        """The prompt format these options ask for (unset fields take the format's defaults)."""
        return PromptFormat(
            instructions=self.instructions,
            list_choices=True if self.list_choices is None else self.list_choices,
            quoted_booleans=bool(self.quoted_booleans),
            chat_template_kwargs=self.chat_template_kwargs or (),
        )


MAX_LABEL_ORDERS = 8
"""The most label orders one call may read (``label_orders``)."""


def _share(name: str, value: Any, expected: str, *, one: bool) -> None:
    """Refuse an option that is not a number in (0, 1) (``one``: 1 allowed too), naming it."""
    if value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or not (0 < value < 1 or (one and value == 1)):
        raise OptionError(f"{name}: expected {expected}, but got {value!r}.")


def _strategy(name: Any) -> str | None:
    if not isinstance(name, str):
        raise OptionError(f"strategy: expected a strategy name (a string), but got {name!r}.")
    if name in STRATEGIES:
        return name
    if name in STRATEGY_ALIASES:
        return STRATEGY_ALIASES[name]
    if name == "hybrid":
        raise OptionError(
            "strategy: 'hybrid' has no counterpart in this pcd; the nearest is 'auto' (marginal up to "
            "marginal_max_labels labels, trie_walk above), or 'exact' to score full label sequences."
        )
    known = [*STRATEGIES, *STRATEGY_ALIASES]
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise OptionError(f"Strategy: expected one of {known} (aliases of the first pcd included), but got {name!r}.{hint}")


def _pairs(value: Any) -> tuple[tuple[str, Any], ...]:
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise OptionError(f"chat_template_kwargs: expected an object of keyword arguments, but got {value!r}.")
    for k, v in value.items():
        try:
            hash(v)
        except TypeError:
            raise OptionError(
                f"chat_template_kwargs.{k}: expected a plain value (str, number, bool), got {v!r}."
            ) from None
    return tuple(sorted(value.items()))


def _head(value: Any) -> Any:
    """A call's ``head`` option as a :class:`~pcd_engine.heads.head.Head`: given as one, as its JSON data, or as
    the path of a saved head.

    Raises:
        OptionError: If it is none of these, or the data or file is not a head (naming what is wrong).
    """
    from pcd_engine.heads.head import Head

    if isinstance(value, Head):
        return value
    try:
        if isinstance(value, Mapping):
            return Head.from_json(value)
        if isinstance(value, (str, os.PathLike)):
            return Head.load(value)
    except InputError as exc:  # given as an option, a malformed head is a bad option
        raise OptionError(f"head: {exc}") from None
    raise OptionError(f"head: expected a Head, its JSON or the path of a saved head, but got {type(value).__name__}.")
