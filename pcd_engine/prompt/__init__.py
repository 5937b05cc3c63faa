"""What the model is asked: the chat-template prompt of a schema, the tokenizer view, and how the tail
tokens align with the text."""

__all__: list[str] = []
