"""``pcd serve``: a side-by-side web page, a JSON API and an OpenAI-compatible endpoint, as one ASGI app.

* ``GET /``: the page. pcd's decisions and the model writing the JSON token by token, side by side, with live
  timers; rows aligned by key; the keys the autoregressive answer missed, invented or filled with a value outside
  the schema are highlighted. One model serves both, so the page runs pcd first and then streams the other.
* ``GET /api/presets``, ``POST /api/extract`` (``{schema, context, options}`` -> values, fields, stats),
  ``POST /api/baseline`` (the autoregressive answer streamed as Server-Sent Events): :mod:`.page_api`.
* ``GET /v1/models`` and ``POST /v1/chat/completions`` (OpenAI-compatible): :mod:`.openai_api`.

The rooms: :mod:`.app` (the app and its HTTP plumbing: hosts, keys, header timeouts), :mod:`.server` (what every
route shares: the engine, the limits, reading bodies), :mod:`.errors` (refusals and error bodies), :mod:`.models`
(the request bodies as Pydantic models), :mod:`.answers` (the replies the OpenAI-style routes build), and the
routers (:mod:`.page_api`, :mod:`.openai_api`, :mod:`.responses_api`).

The engine is thread-safe: concurrent requests run in worker threads and interleave at forward-pass boundaries
(the model runs one pass at a time), and each gets exactly the answer it would get alone. Every request is
bounded: its body by ``max_body_bytes`` and ``body_timeout_s``, its work by :class:`~pcd_engine.limits.
RequestLimits` (labels, generated tokens, time), checked before any model work where the size is known; a client
that disconnects has its work cancelled at the next pass boundary.

Only local pages may drive it: JSON endpoints accept only ``Content-Type: application/json`` (a plain form post
from another site is refused with 415), and the ``Host`` header must name a loopback address, the bound address
or one of ``allowed_hosts`` (DNS rebinding is refused with 421). Bad requests (bad JSON, an unsupported schema,
an empty context, a body too large or too slow) get a 4xx with a JSON error body, never a crash.
"""

from pcd_engine.tools.serve.app import create_app, header_timeout_protocol

__all__ = ["create_app", "header_timeout_protocol"]
