"""Test helpers: a scripted conductor LM that can be saved, a custom role, and config-built programs."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import dspy

from conductor import Budget, Conductor, WorkerPool
from conductor.signatures import Solve
from conductor.testing import ScriptedEngine

POOL_CONFIG: dict[str, Any] = {
    "workers": [
        {"name": "title", "kind": "tool", "tool": "string:capwords", "description": "title-cases text"},
        {"name": "calc", "kind": "tool", "tool": "calculator"},
    ]
}
WORKFLOW = (
    "Check, then compute.\n"
    'model_id = [0, 1]\nsubtasks = ["restate the task", "17 * 23 + 4"]\naccess_list = [[], "all"]\n'
    'roles = ["check", "solve"]'
)


class FixedEngine(ScriptedEngine):
    """A scripted engine that always answers ``text`` and, unlike a script function, can be saved with its LM."""

    def __init__(self, text: str):
        super().__init__(lambda _: text)
        self.text = text

    def dump_state(self) -> dict[str, Any]:
        return {"text": self.text}

    @classmethod
    def load_state(cls, state: dict[str, Any]) -> FixedEngine:
        return cls(**state)


def fixed_lm(text: str = WORKFLOW) -> dspy.LM:
    return dspy.LM("scripted/fixed", engine=FixedEngine(text), cache=False, num_retries=0, max_tokens=256)


class Check(dspy.Signature):
    """Restate the task in one line."""

    question: str = dspy.InputField(desc="the overall task")
    subtask: str = dspy.InputField()
    verdict: str = dspy.OutputField(desc="the task, restated")


def compiled_program(lm: dspy.BaseLM | None = None, **pool_overrides: Any) -> Conductor:
    """A config-built program with what a compile run changes: instructions, a demo, a custom role, a budget."""
    program = Conductor(
        WorkerPool.from_config(POOL_CONFIG | pool_overrides),
        lm or fixed_lm(),
        signature="question -> answer: int",
        max_steps=3,
        roles=(Solve, Check),
        budget=Budget(max_tokens=5_000, max_cost=1.0),
        fallback="none",
    )
    orchestrate = program.orchestrate
    orchestrate.signature = orchestrate.signature.with_instructions("Write a short workflow. Prefer the calculator.")
    orchestrate.demos = [
        dspy.Example(question="1 + 1", reasoning="easy", model_id=[1], subtasks=["1 + 1"], access_list=[[]])
    ]
    solve = program.roles["solve"]
    solve.signature = solve.signature.with_instructions("Solve it exactly; end with 'Answer: <n>'.")
    return program


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on a free localhost port; yields its ``/v1`` base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
