"""What the examples' tests share: running an example as a user would (its own process, from the repository root),
and OpenAI-compatible servers for an example to talk to: the package's own app over a scripted program, and a stand-in
conductor LM that always writes the same workflow."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conductor import Conductor, WorkerPool
from conductor.testing import OpenAIStub, ScriptedWorker, openai_stub, scripted_lm
from tests.deploy.helpers import running

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ONE_STEP = 'model_id = [0]\nsubtasks = ["Answer the question."]\naccess_list = [[]]'


def run_example(script: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> str:
    """Run ``examples/<script>`` with ``args`` and return what it printed; a failed run fails the test with its
    stderr."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=ROOT,
        env=os.environ | (env or {}),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def fixed_program(answer: str) -> Conductor:
    """A program that answers every question with ``answer``: one step on a scripted worker (``pool[0].calls``
    counts the questions it got)."""
    worker = ScriptedWorker("fixed", lambda _: answer)
    return Conductor(WorkerPool([worker]), scripted_lm(lambda _: ONE_STEP))


@contextlib.contextmanager
def served(program: Conductor, model: str) -> Iterator[str]:
    """``program`` served as ``model`` by ``conductor.deploy.create_app`` on a free localhost port; yields the
    ``/v1`` base URL."""
    from conductor.deploy import create_app

    with running(create_app(program, model=model)) as url:
        yield url


@contextlib.contextmanager
def stand_in_conductor(workflow: str) -> Iterator[OpenAIStub]:
    """An OpenAI-compatible server that answers every chat request with ``workflow`` (``conductor.testing``'s stub,
    which would echo the request); its ``api_base`` is the URL, its ``requests`` the count."""
    with openai_stub(latency_s=0.0) as stub:
        echo = stub.answer

        def answer(body: dict) -> dict:
            reply = echo(body)
            reply["choices"][0]["message"]["content"] = workflow
            return reply

        stub.answer = answer
        yield stub
