"""pcd_integrations: thin adapters from host frameworks to :class:`pcd_engine.Engine`.

Each adapter is its own module, imported on demand so that the package never pulls a framework in:
``pcd_integrations.langchain`` (``ChatPCD``; ``pip install "pcd-llm[langchain]"``), ``pcd_integrations.llamaindex``
(``PCDPydanticProgram``, ``PCDLLM``, ``PCDMetadataExtractor``; ``pip install "pcd-llm[llamaindex]"``) and
``pcd_integrations.ray`` (``tag_dataset`` on Ray Data; ``pip install "pcd-llm[ray]"``).
"""

__all__: list[str] = []
