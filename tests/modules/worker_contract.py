"""The contract every ``Worker`` keeps (see ``conductor.modules.workers.Worker``), as tests any worker's suite reuses.

Subclass ``WorkerContract`` in a test class that provides two fixtures: ``worker`` (function-scoped, since a test
closes it) and ``prompt_messages``, chat messages that worker can answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

from conductor.modules.workers import Completion, Messages, Worker


def _assert_completion(completion: object) -> None:
    assert isinstance(completion, Completion)
    assert isinstance(completion.text, str)
    for count in (completion.input_tokens, completion.output_tokens):
        assert type(count) is int
        assert count >= 0


class WorkerContract:
    def test_complete_returns_a_completion(self, worker: Worker, prompt_messages: Messages) -> None:
        completion = worker.complete(prompt_messages, max_tokens=worker.max_tokens, temperature=worker.temperature)
        _assert_completion(completion)

    def test_output_tokens_stay_within_max_tokens(self, worker: Worker, prompt_messages: Messages) -> None:
        completion = worker.complete(prompt_messages, max_tokens=5, temperature=worker.temperature)
        _assert_completion(completion)
        assert completion.output_tokens <= 5

    def test_the_awaited_step_keeps_the_contract(self, worker: Worker, prompt_messages: Messages) -> None:
        question = prompt_messages[-1]["content"]  # what the executor awaits: a step's inputs and its prompt
        step = worker.acomplete_step(
            {"question": question, "context": "", "subtask": question}, prompt_messages, max_tokens=5, temperature=0.0
        )
        completion = asyncio.run(step)
        _assert_completion(completion)
        assert completion.output_tokens <= 5

    def test_count_tokens_is_a_positive_int(self, worker: Worker, prompt_messages: Messages) -> None:
        count = worker.count_tokens(prompt_messages)
        assert type(count) is int
        assert count > 0

    def test_complete_is_thread_safe(self, worker: Worker, prompt_messages: Messages) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            futures = [
                pool.submit(worker.complete, prompt_messages, max_tokens=worker.max_tokens, temperature=0.0)
                for _ in range(4)
            ]
            completions = [future.result(timeout=120) for future in futures]
        assert len(completions) == 4
        for completion in completions:
            _assert_completion(completion)

    def test_close_can_be_called_twice(self, worker: Worker) -> None:
        worker.close()
        worker.close()
