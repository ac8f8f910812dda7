"""``POST /v1/chat/completions``: read and check the request, run it under a timeout, and answer with a
``chat.completion`` or its stream; how each failure maps to an OpenAI error is ``conductor.deploy.server``'s
docstring.

A run is awaited on the event loop (API models' calls hold no thread; blocking ones run on daemon threads), at most
``concurrency`` of them at once: a request waits for a free run slot, and that wait counts in its timeout.

Every request leaves exactly one audit row, whose outcome is what its client got (``timeout`` for a 408 or a 504,
``disconnected`` for a client gone mid-upload, ``error`` for a 5xx). The row is written when the answer is ready and
before it is sent; a row that can't be written turns the answer into a 503, so no answer goes out unrecorded. The
one exception is a run still going when its client got a 504: its row is written when the run ends, so that it holds
what the run spent (a request still waiting for a run slot never runs, and its row is written at once).
"""

import asyncio
import dataclasses
import logging
import time
from typing import Any

import dspy

from conductor.deploy._audit import AuditEntry, Outcome
from conductor.deploy.server._auth import Caller, Callers
from conductor.deploy.server._budget import request_budget
from conductor.deploy.server._ids import new_id
from conductor.deploy.server._replies import Replies
from conductor.deploy.server._request import check_request, parse, program_inputs, question_text, read_body
from conductor.deploy.server._runner import Runner
from conductor.deploy.server._schema import ChatRequest, Completion, RequestError, conductor_field, run_result, usage
from conductor.deploy.server._spend import OUTCOMES
from conductor.errors import ConductorError
from conductor.modules import Budget, Conductor

logger = logging.getLogger(__name__)

COST_HEADER = "x-conductor-cost-usd"


class _RunOutlivedItsClient(Exception):
    """The client got ``error`` (a 504) while its run goes on; the run's row is written when it ends."""

    def __init__(self, error: RequestError):
        super().__init__(error.message)
        self.error = error


@dataclasses.dataclass(frozen=True)
class ChatRoute:
    """The chat handler of a server over ``program``, served as ``model``; ``run_slots`` holds one slot per run in
    flight."""

    program: Conductor
    model: str
    callers: Callers
    runner: Runner
    run_slots: asyncio.Semaphore
    replies: Replies
    max_request_bytes: int
    request_timeout_s: float
    body_timeout_s: float
    outliving: set[asyncio.Task] = dataclasses.field(default_factory=set)
    """Runs whose client got a 504, until they end (the event loop keeps only weak references to tasks)."""

    async def __call__(self, request: Any) -> Any:
        entry = AuditEntry(request.state.request_id, self.model, "error")
        started = time.perf_counter()
        try:
            response = await self._respond(request, entry, started)
        except _RunOutlivedItsClient as late:
            return self.replies.error(late.error)
        except RequestError as exc:
            entry.outcome, entry.error = outcome_of(exc), exc.message
            response = self.replies.error(exc)
        except Exception as exc:  # a bug: answered as an OpenAI error and audited like any answer
            logger.exception("request %s failed", entry.request_id)
            error = RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error")
            entry.outcome, entry.error = "error", error.message
            response = self.replies.error(error)
        return await self._audited(entry, started, response)

    async def _respond(self, request: Any, entry: AuditEntry, started: float) -> Any:
        """The answer to ``request``; the entry notes who asked what and what the run did."""
        if self.callers.queries_database:  # stored keys: off the event loop, as the audit write is
            caller = await self.callers.keys.database.run(lambda: self.callers.of(request))
        else:  # a keys file's or none: no I/O, so no thread (a thread hop is CPU on every request)
            caller = self.callers.of(request)
        entry.key_id = caller.key.id if caller.key is not None else None
        chat = parse(await read_body(request, self.max_request_bytes, self.body_timeout_s))
        entry.request = chat.model_dump(exclude={"messages"}, exclude_unset=True)
        check_request(chat, self.model)
        inputs = program_inputs(self.program.signature, question_text(chat.messages))
        budget = request_budget(caller.ceiling, chat)
        run_started = time.perf_counter()
        prediction = await self._run(caller, inputs, budget, entry, started)
        return self._answer(chat, prediction, budget, run_started)

    async def _audited(self, entry: AuditEntry, started: float, response: Any) -> Any:
        """``response`` once its row is in the audit log, or a 503 (with the run's cost, if any) when it can't be."""
        try:
            await self.runner.write(entry, started)
        except RequestError as exc:
            cost = response.headers.get(COST_HEADER)
            return self.replies.error(exc, {COST_HEADER: cost} if cost is not None else None)
        return response

    async def _run(
        self, caller: Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry, started: float
    ) -> dspy.Prediction:
        """The run's prediction, once a run slot is free; a ``RequestError`` for a timeout, a refusal, or a failure of
        the conductor LM."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        timeout = RequestError(504, f"no answer within {self.request_timeout_s:g} s", "timeout", "timeout_error")
        try:
            async with asyncio.timeout_at(deadline):
                await self.run_slots.acquire()
        except TimeoutError:
            raise timeout from None  # it never started: nothing to wait for
        run = asyncio.create_task(self._run_in_slot(caller, inputs, budget, entry))
        done, _ = await asyncio.wait([run], timeout=deadline - loop.time())
        if not done:
            self.outliving.add(run)
            run.add_done_callback(lambda _: self._write_late(run, entry, started, timeout))
            raise _RunOutlivedItsClient(timeout)
        try:
            return run.result()
        except ConductorError as exc:  # the library's own report, e.g. an unreachable conductor LM
            raise RequestError(502, str(exc), "upstream_error", "server_error") from None

    async def _run_in_slot(
        self, caller: Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry
    ) -> dspy.Prediction:
        try:
            return await self.runner(caller, inputs, budget, entry)
        finally:
            self.run_slots.release()

    def _write_late(self, run: asyncio.Task, entry: AuditEntry, started: float, timeout: RequestError) -> None:
        """Have the row of a run whose client got ``timeout`` written, off the event loop, now that the run ended."""
        self.outliving.discard(run)
        if not run.cancelled():
            run.exception()  # seen here: whatever the run raised, its client had its 504 and its row says timeout
        entry.outcome, entry.error = "timeout", timeout.message
        self.runner.write_later(entry, started)

    def _answer(self, chat: ChatRequest, prediction: dspy.Prediction, budget: Budget, started: float) -> Any:
        """The run's answer as a ``chat.completion`` (or its stream), or the 400 for a run that had none to give."""
        result, error = run_result(prediction), prediction.error
        trace = conductor_field(prediction, result, budget, time.perf_counter() - started)
        cost = {COST_HEADER: f"{result.cost:.10g}"}
        if error is not None and error.kind == "input":
            return self.replies.error(RequestError(400, error.message, "invalid_input"), cost)
        if error is not None and error.kind == "budget" and prediction.response is None:
            message = f"the budget ran out before an answer: {error.message}"
            return self.replies.error(RequestError(400, message, "budget_exceeded", extra={"conductor": trace}), cost)
        completion = Completion(f"chatcmpl-{new_id()}", int(time.time()), self.model)
        answer = prediction[next(iter(self.program.signature.output_fields))]
        content = "" if answer is None else str(answer)
        finish = "length" if error is not None and error.kind == "budget" else "stop"
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            events = completion.chunks(content, finish, usage(result), trace, include_usage)
            return self.replies.events(events, {**cost, "cache-control": "no-cache"})
        return self.replies.json(completion.message(content, finish, usage(result), trace), 200, cost)


def outcome_of(error: RequestError) -> Outcome:
    """The audit outcome of a request answered with ``error``."""
    return OUTCOMES.get(error.status, "input" if error.status < 500 else "error")
