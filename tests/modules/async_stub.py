"""An OpenAI-compatible chat server on an event loop of its own, for tests that count threads: it holds any number of
requests on one thread, where ``conductor.testing.openai_stub`` spends a thread on each.

It answers after ``latency_s`` (the model ``slow``: four times that): the model ``conductor`` with ``WORKFLOW`` (a
two-step workflow over worker 0), the model ``refuses`` with a 400 (a request that would fail again), any other with
``echo: <the last message's end>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator

import dspy
import pytest

WORKFLOW = 'model_id = [0, 0]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


@dataclasses.dataclass
class AsyncStub:
    """What the server saw: its ``api_base``, the requests it got, and the most it held at once."""

    latency_s: float
    api_base: str = ""
    requests: int = 0
    in_flight: int = 0
    most_in_flight: int = 0

    def lm(self, model: str, **options) -> dspy.LM:
        """A ``dspy.LM`` for ``model`` on this server (no DSPy cache or retries unless ``options`` say so)."""
        return dspy.LM(
            f"openai/{model}", api_base=self.api_base, api_key="x", **{"cache": False, "num_retries": 0} | options
        )


@contextlib.contextmanager
def async_openai_stub(latency_s: float) -> Iterator[AsyncStub]:
    pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tests.deploy.helpers import running

    stub = AsyncStub(latency_s)

    async def chat(request) -> JSONResponse:
        body = await request.json()
        model = body["model"]
        stub.requests += 1
        stub.in_flight += 1
        stub.most_in_flight = max(stub.most_in_flight, stub.in_flight)
        try:
            await asyncio.sleep(stub.latency_s * (4 if model == "slow" else 1))
        finally:
            stub.in_flight -= 1
        if model == "refuses":
            error = {"message": "this request can never work", "type": "invalid_request_error", "code": None}
            return JSONResponse({"error": error}, status_code=400)
        text = WORKFLOW if model == "conductor" else f"echo: {body['messages'][-1]['content'][-40:]}"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return JSONResponse(
            {
                "id": "stub",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )

    with running(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])) as api_base:
        stub.api_base = api_base
        yield stub
