"""Deciders: the one object per call that turns what its passes read into each closed field's decision.

:mod:`~pcd_engine.deciders.base` says what every decider is; :mod:`~pcd_engine.deciders.corrections` holds the
corrections the options name (``none``, ``auto``, ``content_free``, ``batch``); :mod:`~pcd_engine.deciders.fitted`
the ones a user fits (a calibration, a decision head). :func:`decider_for` resolves a call's options into one; no
module outside this package compares a source's name or tests which of head, calibration or correction is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pcd_engine.deciders.base import Decider, Lean, Reading
from pcd_engine.deciders.corrections import correction_named
from pcd_engine.deciders.fitted import Calibrated, Headed

if TYPE_CHECKING:
    from pcd_engine.calibrate.calibrator import Calibrator
    from pcd_engine.heads.head import Head

__all__ = ["Decider", "Lean", "Reading", "decider_for"]


def decider_for(*, correction: str | None, calibration: Calibrator | None, head: Head | None) -> Decider:
    """The one decider of a call's options: a head (falling back to the rest) over a calibration, which wins over
    the correction named (``None``: ``"none"``).

    Raises:
        OptionError: If no correction has that name.
    """
    base: Decider = Calibrated(calibration) if calibration is not None else correction_named(correction)
    return Headed(head, base) if head is not None else base
