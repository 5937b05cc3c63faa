"""Correcting the model's label lean: fitted calibrations and the corrections a call estimates by itself."""

__all__: list[str] = []
