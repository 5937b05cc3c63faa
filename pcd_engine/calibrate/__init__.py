"""Calibrations: label-lean corrections fitted from examples or documents (:mod:`~pcd_engine.calibrate.calibrator`),
their estimators and label shares, and what every fitted file shares (:mod:`~pcd_engine.calibrate.fitted`)."""

__all__: list[str] = []
