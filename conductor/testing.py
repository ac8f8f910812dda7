"""Scripted stand-ins for tests and examples: a conductor LM and workers whose answers you decide.

``scripted_lm`` is a real ``dspy.LM`` behind a custom DSPy engine, so code under test takes exactly the path a
real model takes; ``ScriptedWorker`` is a ``Worker`` that can also fail, hang and count its calls; ``openai_stub``
is a local OpenAI-compatible chat server with a set latency, for API workers without a provider.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
from dspy.lm15 import Message, Request, Response, TextPart, Usage, response_to_events

from conductor.errors import WorkerError
from conductor.modules import Completion, Messages, Worker

Script = Callable[[str], str] | Iterable[str]


def _responder(script: Script) -> Callable[[str], str]:
    if callable(script):
        return script
    answers, lock = iter(script), threading.Lock()

    def next_answer(_: str) -> str:
        with lock:
            answer = next(answers, None)
        if answer is None:
            raise RuntimeError("the scripted LM has no responses left")
        return answer

    return next_answer


class ScriptedEngine:
    """A DSPy engine that answers from a script: a list of texts (in order) or a function of the prompt text."""

    def __init__(self, script: Script):
        self._respond = _responder(script)
        self.prompts: list[str] = []

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of OpenAI-style ``messages``, counted as ``complete`` counts them (words)."""
        return sum(len(m["content"].split()) for m in messages)

    def complete(self, request: Request) -> Response:
        system = request.system if isinstance(request.system, str) else ""
        prompt = "\n\n".join([system, *(m.text or "" for m in request.messages)])
        self.prompts.append(prompt)
        text = self._respond(prompt)
        words = text.split()
        limit = request.config.max_tokens
        if limit is not None and len(words) > limit:  # a word is a token here; honour max_tokens like a model
            words = words[:limit]
            text = " ".join(words)
        words_in, words_out = len(prompt.split()), len(words)
        return Response(
            id=None,
            model="scripted",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=Usage(input_tokens=words_in, output_tokens=words_out, total_tokens=words_in + words_out),
        )

    def stream(self, request: Request):
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def scripted_lm(script: Script, model: str = "scripted/conductor") -> dspy.LM:
    """A ``dspy.LM`` whose completions come from ``script``; its engine is at ``lm.scripted_engine``."""
    engine = ScriptedEngine(script)
    lm = dspy.LM(model, engine=engine, cache=False, num_retries=0)
    lm.scripted_engine = engine
    return lm


class ScriptedWorker(Worker):
    """A worker that answers from a script, fails its first ``fail_times`` calls, or sleeps ``delay_s`` first.

    Token counts are word counts, so tests can predict them; ``calls`` counts every call, failed ones included.
    """

    def __init__(
        self, name: str, script: Script = lambda _: "ok", *, fail_times: int = 0, delay_s: float = 0.0, **kwargs
    ):
        super().__init__(name, **kwargs)
        self._respond = _responder(script)
        self.fail_times = fail_times
        self.delay_s = delay_s
        self.calls = 0
        self.messages: list[Messages] = []  # every call's messages, in order
        self._lock = threading.Lock()

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        with self._lock:
            self.calls += 1
            call = self.calls
            self.messages.append(messages)
        if self.delay_s:
            time.sleep(self.delay_s)
        if call <= self.fail_times:
            raise WorkerError(f"{self.name}: scripted failure {call} of {self.fail_times}")
        text = self._respond(messages[-1]["content"])
        words = text.split()
        if len(words) > max_tokens:  # keep the contract: never more than max_tokens
            words = words[:max_tokens]
            text = " ".join(words)
        return Completion(text, self.count_tokens(messages), len(words))

    def count_tokens(self, messages: Messages) -> int:
        return sum(len(m["content"].split()) for m in messages)

    @property
    def prompts(self) -> list[str]:
        """The last user message of every call."""
        return [m[-1]["content"] for m in self.messages]


class OpenAIStub:
    """What an ``openai_stub`` server saw: its ``api_base``, the requests it answered, and the most it had in flight."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s
        self.api_base = ""
        self.requests = 0
        self.most_in_flight = 0
        self.starts: list[float] = []  # time.monotonic() of each request's arrival
        self._in_flight = 0
        self._lock = threading.Lock()

    def answer(self, body: dict) -> dict:
        """Answer one chat request after the latency, counting it."""
        with self._lock:
            self.requests += 1
            self._in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)
            self.starts.append(time.monotonic())
        try:
            time.sleep(self.latency_s)
        finally:
            with self._lock:
                self._in_flight -= 1
        text = f"echo: {body['messages'][-1]['content']}"[:200]
        return {
            "id": f"stub-{self.requests}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "stub"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }


@contextlib.contextmanager
def openai_stub(latency_s: float = 0.05) -> Iterator[OpenAIStub]:
    """A local OpenAI-compatible ``/v1/chat/completions`` server (one thread per request) that answers ``"echo: <last
    message>"`` after ``latency_s``; use it as ``dspy.LM("openai/stub", api_base=stub.api_base, api_key="x")``."""
    stub = OpenAIStub(latency_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            reply = json.dumps(stub.answer(body)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # the default backlog of 5 resets connections that arrive together

    server = Server(("127.0.0.1", 0), Handler)
    stub.api_base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
