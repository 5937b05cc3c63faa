"""Deciding the closed fields: token tries (the tree), their compilation in context, pass planning, staged
reading and the decision strategies."""

__all__: list[str] = []
