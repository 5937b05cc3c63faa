"""Decision heads: small fitted models that decide a schema's closed fields from the hidden states of the passes pcd
runs anyway (:mod:`~pcd_engine.heads.head`), one per field (:mod:`~pcd_engine.heads.fields`), each kept only where
its held-out examples say it helps (:mod:`~pcd_engine.heads.gates`)."""

__all__: list[str] = []
