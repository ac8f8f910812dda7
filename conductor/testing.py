"""Scripted stand-ins for tests and examples: a conductor LM and workers whose answers you decide.

``scripted_lm`` is a real ``dspy.LM`` behind a custom DSPy engine, so code under test takes exactly the path a
real model takes; ``ScriptedWorker`` is a ``Worker`` that can also fail, hang and count its calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

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
