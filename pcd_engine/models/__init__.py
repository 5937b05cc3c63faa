"""Model names: aliases, Hugging Face ids, local folders, GGUF files and Ollama names, and the embedded
default model."""

__all__: list[str] = []
