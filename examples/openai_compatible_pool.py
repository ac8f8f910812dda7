"""A pool of OpenAI-compatible endpoints (vLLM, llama.cpp's server, Ollama, LM Studio, another `conductor serve`):
each worker is a litellm model string with the server's ``api_base``, and the conductor LM is one too.

    export OPENAI_API_KEY=none   # the servers' key (any text for a server without keys); --api-key-env names another
    python examples/openai_compatible_pool.py "What is the boiling point of water in Fahrenheit?" \\
        --api-base http://127.0.0.1:8000/v1 \\
        --worker small=openai/Qwen/Qwen2.5-0.5B-Instruct --worker large=openai/Qwen/Qwen2.5-7B-Instruct \\
        --conductor openai/Qwen/Qwen2.5-7B-Instruct

``openai/<model>`` tells litellm to speak the OpenAI chat API to ``api_base``; ``<model>`` is the name the server
knows the model by. Workers on different servers take an ``api_base`` each (edit ``pool_config``). Your own servers
bill nothing, so the workers are priced at $0; give a paid endpoint its ``price`` for cost budgets to count it.
"""

from __future__ import annotations

import argparse
import os

import dspy

from conductor import Conductor, WorkerPool


def name_and_model(text: str) -> tuple[str, str]:
    name, _, model = text.partition("=")
    if not name or not model:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=MODEL, e.g. small=openai/Qwen/Qwen2.5-0.5B-Instruct")
    return name, model


def pool_config(workers: list[tuple[str, str]], api_base: str, api_key_env: str) -> dict:
    """A pool config (the same shape as a pool YAML file) of chat models behind one OpenAI-compatible server."""
    endpoint = {"api_base": api_base, "api_key_env": api_key_env, "price": {"input_per_1k": 0.0, "output_per_1k": 0.0}}
    return {"workers": [{"name": name, "kind": "lm", "model": model, **endpoint} for name, model in workers]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question")
    parser.add_argument("--api-base", required=True, help="the workers' server, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--worker", type=name_and_model, action="append", required=True, help="NAME=MODEL, repeated")
    parser.add_argument("--conductor", required=True, help="the model that writes the workflows, e.g. openai/<name>")
    parser.add_argument("--conductor-api-base", help="the conductor's server (default: --api-base)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="the variable holding the servers' key")
    args = parser.parse_args()

    pool = WorkerPool.from_config(pool_config(args.worker, args.api_base, args.api_key_env))
    lm = dspy.LM(
        args.conductor,
        api_base=args.conductor_api_base or args.api_base,
        api_key=os.environ[args.api_key_env],  # set: the pool refused to build without it
        max_tokens=512,
        temperature=0.0,
        cache=False,
    )
    program = Conductor(pool, lm, max_steps=3)
    prediction = program(question=args.question)

    print("Workflow:")
    print(prediction.workflow.to_text(pool.names) if prediction.workflow else f"none ({prediction.error})")
    for step in prediction.trace:
        tokens = step.prompt_tokens + step.completion_tokens
        print(f"step {step.index} · {step.answered_by or step.worker} · {tokens} tokens · {step.latency_s:.2f} s")
        print(f"    {step.output if step.error is None else 'failed: ' + step.error}")
    print(f"Answer: {prediction.answer}")
    print(f"Total: {prediction.tokens} tokens · ${prediction.cost:.6f}")


if __name__ == "__main__":
    main()
