"""pcd_integrations: thin adapters from host frameworks (LangChain, LlamaIndex) to :class:`pcd_engine.Engine`.

The adapters arrive in later releases; this package pins the namespace.
"""

__all__: list[str] = []
