"""One program as one model behind an OpenAI-compatible HTTP API: ``POST /v1/chat/completions``, ``GET /v1/models``
(and ``/v1/models/{id}``) and ``GET /health``, answered as vLLM and LiteLLM's proxy answer, so the official ``openai``
SDK and ``litellm`` work unchanged.

A thin layer over the library: the question (the last user message) goes to the ``Conductor``, which writes a
workflow (``Conductor.aask``); the workflow is checked against the caller's key and run by the program's executor;
the prediction comes back as a ``chat.completion`` whose extra ``conductor`` field holds the workflow, the per-step
trace, tokens, cost (split by step and by worker) and the run's error, if any. ``usage`` counts every step and the
conductor LM's own call. Runs are awaited on the event loop, at most ``concurrency`` at once: API models' calls hold
no thread, and blocking ones (local models, tools) run on daemon threads.

The OpenAI request, as read here:

- ``model``: the served model's id, or absent; another id is a 404 (``model_not_found``).
- ``stream: true``: server-sent events (``chat.completion.chunk`` objects, then ``data: [DONE]``); the answer comes
  in one content chunk once the run is over, with the ``conductor`` field on the chunk that ends the choice, and
  ``stream_options: {"include_usage": true}`` adds a last chunk with ``usage``.
- ``max_tokens`` / ``max_completion_tokens``: lower the run's token budget (every step's prompt and completion and the
  conductor's own call), never raising the server's or the key's.
- ``conductor_budget``: any ``Budget`` field, lowering the same way.
- ``n`` other than 1, ``response_format`` other than ``text``, and ``tools`` / ``functions``: refused with a 400, as
  the program writes one free-text answer and calls no client tools.
- ``temperature`` (0 to 2) is accepted and changes nothing: the conductor LM and each worker keep the sampling
  settings the program was compiled with. ``top_p``, ``stop``, ``seed``, ``user``, ``metadata`` and other fields are
  accepted and ignored (and audited).

Every response has an ``x-request-id`` header (the client's, when it sends a usable one; else a new one), and every
run's response an ``x-conductor-cost-usd`` header. Every error, on every route (404 for an unknown route, 405 for a
wrong method, 400 for a request that doesn't parse or validate), is an OpenAI error object ``{"error": {"message",
"type", "param", "code"}}``. A run the budget stopped before any answer is a 400 with code ``budget_exceeded`` (as
OpenAI answers a prompt over the context length: clients raise ``BadRequestError`` and don't retry a request that
would fail again, where a 429 would be retried and a 402 is unknown to them); the error carries the run's
``conductor`` field.

Governance (``conductor/deploy/_governance.py``, ``_stored_keys.py`` and ``_audit.py``): with keys (a ``KeyStore``,
or keys stored in the database), every request needs ``Authorization: Bearer <key>`` (else 401); a workflow that would
call a worker the key may not use is refused with a 403 before any worker runs (the conductor's fallback included),
and failover never reaches such a worker; a key's daily limits are held with a reservation in the database (SQLite,
or PostgreSQL shared by replicas) before the run (429 when it won't fit). With ``audit_db``, every chat request is
appended to the audit log, redacted: refused ones too, with the reason.

Needs FastAPI (``pip install 'dspy-conductor[serve]'``), imported only when an app is made.

The parts, one file each: ``_schema`` (the OpenAI request, error and completion objects), ``_request`` (reading and
checking a request), ``_budget`` (a run's budget from the request), ``_auth`` (callers, keys, allowed workers),
``_spend`` (the audit log, the daily spend reservation, a run's record), ``_runner`` (one run under the caller's rules),
``_chat`` (the chat route, streaming included), ``_replies`` (HTTP responses), ``_ids`` (request ids), ``_app`` (the
app factory that wires them), ``_socket`` (the listening socket server processes share) and ``_collector`` (the
garbage collector of a server process).
"""

from conductor.deploy.server._app import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_TIMEOUT_S,
    create_app,
    import_serving,
)
from conductor.deploy.server._collector import tune_gc_for_serving
from conductor.deploy.server._socket import listening_socket

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_TIMEOUT_S",
    "create_app",
    "import_serving",
    "listening_socket",
    "tune_gc_for_serving",
]
