"""Deploy a program and call it: save it as a folder, serve the folder as an OpenAI-compatible API, and call that
with the ``openai`` SDK, once plainly and once streaming.

    python examples/deploy_and_call.py "What is 17 * 23 + 4?"
    python examples/deploy_and_call.py "What is 17 * 23 + 4?" --pool examples/data/tools_pool.yaml

The program is a fresh conductor over the embedded local pool (or ``--pool FILE``). ``--conductor`` names its LM as
``conductor run --conductor`` does: ``local/smollm2-135m-instruct`` (the default: the embedded model, decoding under
the workflow grammar), a checkpoint folder, or a litellm model such as ``openai/gpt-4o-mini``, which reads its key
(``OPENAI_API_KEY``) and, for a server of your own, its URL (``OPENAI_BASE_URL``) from the environment.

The server runs inside this script (``conductor.deploy.create_app`` under uvicorn) so that it is one file; in
production serve the saved folder with ``conductor serve FOLDER --port 8000`` (``--keys`` for API keys and budgets,
``--workers N`` for several processes). Needs the ``serve`` extra: ``pip install 'dspy-conductor[serve]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Iterator

import openai
import uvicorn

import conductor
from conductor import Conductor, WorkerPool
from conductor.deploy import conductor_lm, create_app, is_trainable

MODEL = "my-conductor"  # the model name clients ask the server for


def build_program(conductor_name: str, pool_file: str | None) -> Conductor:
    pool = WorkerPool.from_file(pool_file) if pool_file else WorkerPool.default()
    program = Conductor(pool, conductor_lm(conductor_name, max_tokens=256), max_steps=3)
    if is_trainable(conductor_name):  # a local model: it writes valid workflows only under the grammar
        from conductor.conductor_lm import constrain_program  # torch: only for a local conductor

        constrain_program(program)
    return program


@contextlib.contextmanager
def serving(app, port: int) -> Iterator[str]:
    """Serve ``app`` on localhost from a background thread (port 0: a free one); yields the ``/v1`` base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise SystemExit(f"the server did not start (is port {port} taken?)")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question")
    parser.add_argument("--conductor", default="local/smollm2-135m-instruct", help="the conductor LM (see above)")
    parser.add_argument("--pool", help="a pool file (YAML or TOML; default: the embedded local pool)")
    parser.add_argument("--folder", default="runs/my-conductor", help="where to save the program")
    parser.add_argument("--port", type=int, default=0, help="the server's port (default: a free one)")
    args = parser.parse_args()

    folder = conductor.save(build_program(args.conductor, args.pool), args.folder)
    print(f"Saved the program to {folder}")
    app = create_app(conductor.load(folder), model=MODEL)  # what `conductor serve FOLDER` serves
    with serving(app, args.port) as base_url:
        print(f"Serving {MODEL} at {base_url}")
        client = openai.OpenAI(base_url=base_url, api_key="unused")  # a server without --keys takes any key
        messages = [{"role": "user", "content": args.question}]

        completion = client.chat.completions.create(model=MODEL, messages=messages)
        run = completion.model_extra["conductor"]  # beside the answer: the workflow, each step, tokens and cost
        print(f"Answer: {completion.choices[0].message.content}")
        print(f"Workflow:\n{run['workflow']}")
        print(f"Tokens: {completion.usage.total_tokens} · cost ${run['cost']:.6f} · {run['latency_s']:.2f} s")

        stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        print(f"Streamed answer: {streamed}")


if __name__ == "__main__":
    main()
