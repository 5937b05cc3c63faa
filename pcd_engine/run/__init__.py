"""Running requests: one request's steps, batches of requests, the collector of concurrent calls, the compile
cache, and admission (checks, limits and the memory budget)."""

__all__: list[str] = []
