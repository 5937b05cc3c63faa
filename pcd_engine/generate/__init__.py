"""Generating the open fields and free text: open rows under their grammars, drafts copied from the prompt, and
chat text."""

__all__: list[str] = []
