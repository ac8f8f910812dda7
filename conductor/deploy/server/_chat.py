"""``POST /v1/chat/completions``: read and check the request (refusals audited), run it on a server thread under a
timeout, and answer with a ``chat.completion`` or its stream; how each failure maps to an OpenAI error is
``conductor.deploy.server``'s docstring."""

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from typing import Any

import dspy

from conductor.deploy._audit import AuditEntry
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


@dataclasses.dataclass(frozen=True)
class ChatRoute:
    """The chat handler of a server over ``program``, served as ``model``."""

    program: Conductor
    model: str
    callers: Callers
    runner: Runner
    threads: concurrent.futures.ThreadPoolExecutor
    replies: Replies
    max_request_bytes: int
    request_timeout_s: float

    async def __call__(self, request: Any) -> Any:
        entry = AuditEntry(request.state.request_id, self.model, "error")
        try:
            caller, chat, inputs, budget = await self._read(request, entry)
        except RequestError as exc:
            return await self._refused(entry, exc)
        started = time.perf_counter()
        try:
            prediction = await self._run(caller, inputs, budget, entry)
        except RequestError as exc:
            return self.replies.error(exc)
        return self._answer(chat, prediction, budget, started)

    async def _read(self, request: Any, entry: AuditEntry) -> tuple[Caller, ChatRequest, dict[str, Any], Budget]:
        """The caller, the request, the program's inputs and the run's budget; the entry notes who asked what."""
        caller = self.callers.of(request)
        entry.key_id = caller.key.id if caller.key is not None else None
        chat = parse(await read_body(request, self.max_request_bytes))
        entry.request = chat.model_dump(exclude={"messages"}, exclude_unset=True)
        check_request(chat, self.model)
        inputs = program_inputs(self.program.signature, question_text(chat.messages))
        return caller, chat, inputs, request_budget(caller.ceiling, chat)

    async def _refused(self, entry: AuditEntry, error: RequestError) -> Any:
        """Refuse a request before its run, recording why in the audit log."""
        audit = self.runner.audit
        if audit is not None:
            entry.outcome, entry.error = OUTCOMES.get(error.status, "input"), error.message
            await asyncio.get_running_loop().run_in_executor(None, audit.write, entry)
        return self.replies.error(error)

    async def _run(self, caller: Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """The run's prediction, from a server thread; a ``RequestError`` for a timeout, a refusal, or a failure."""
        future = self.threads.submit(self.runner, caller, inputs, budget, entry)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.request_timeout_s)
        except TimeoutError:
            raise RequestError(
                504, f"no answer within {self.request_timeout_s:g} s", "timeout", "timeout_error"
            ) from None
        except RequestError:
            raise
        except ConductorError as exc:  # the library's own report, e.g. an unreachable conductor LM
            raise RequestError(502, str(exc), "upstream_error", "server_error") from None
        except Exception as exc:
            logger.exception("the program failed")
            raise RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", "server_error") from None

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
