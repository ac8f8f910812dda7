"""One request's run, awaited on the server's event loop: ``Conductor.aask`` and ``Conductor.arun_reply`` under the
caller's rules (the day's spend reserved first, the workflow checked against the key's workers before any runs, the
reservation settled to the real spend), with what it did and spent copied into the request's audit entry; and the
writing of that entry, which the chat route does once per request. The database's work is synchronous, so it runs off
the event loop, on the database's own threads (``Database.run``).

A store that can't be written (the database locked, full or gone) is a 503 (``storage_unavailable``), logged in one
line: the server's problem, which a client may retry, never a 500. What holds then: a reservation that can't be
settled stays held at the run's worst case, so a day never counts less than was spent; the audit row is one INSERT
in one transaction, so it is written whole or not at all."""

import contextlib
import dataclasses
import time
from typing import Any

import dspy

from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._governance import KeySpec, Reservation, SpendLedger
from conductor.deploy.server._auth import Caller, check_workers
from conductor.deploy.server._schema import RequestError, storage
from conductor.deploy.server._spend import record, reserve
from conductor.modules import Budget, Conductor, RunError, Workflow


@dataclasses.dataclass(frozen=True)
class Runner:
    """Runs requests for ``program`` under their caller's rules and writes their audit rows."""

    program: Conductor
    ledger: SpendLedger | None
    audit: AuditLog | None

    async def __call__(
        self, caller: Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry
    ) -> dspy.Prediction:
        """Run one request; ``entry`` gets the question, the workflow, the outcome and what the run spent (when it
        raises: what it knew by then)."""
        program = self.program
        question = program.question_text(inputs)
        if isinstance(question, RunError):
            return _recorded(entry, program.no_answer(question))
        entry.question = question
        return await self._run(caller, question, budget, entry)

    async def write(self, entry: AuditEntry, started: float) -> None:
        """Append ``entry`` (its latency counted from ``started``, a ``time.perf_counter()``) to the audit log, if
        the server keeps one; a 503 when it can't be written."""
        if self.audit is not None:
            await self.audit.database.run(lambda: self._write(entry, started))

    def write_later(self, entry: AuditEntry, started: float) -> None:
        """``write`` without waiting, for a request whose client already has its answer: a row that can't be written
        is logged, not raised."""

        def write() -> None:
            with contextlib.suppress(RequestError):  # ``storage`` has logged it
                self._write(entry, started)

        if self.audit is not None:
            self.audit.database.submit(write)

    def _write(self, entry: AuditEntry, started: float) -> None:
        """``write``, blocking the calling thread."""
        entry.latency_s = time.perf_counter() - started
        with storage(f"write the audit log (request {entry.request_id})"):
            self.audit.write(entry)

    async def _run(self, caller: Caller, question: str, budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """``Conductor.aforward`` with the caller's rules around it: the day's spend reserved first, the workflow (or
        the fallback) checked against the key's workers before any runs, the reservation settled to the real spend."""
        program, ledger = self.program, self.ledger
        reservation = None
        if ledger is not None and caller.key is not None:  # a database write: off the event loop
            reservation = await ledger.database.run(lambda: self._reserve(caller.key, budget))
        prediction = None
        try:

            def check(workflow: Workflow, format_error: RunError | None) -> None:
                entry.workflow = workflow.to_text()
                check_workers(program.pool, caller.key, workflow, format_error)

            reply = await program.aask(question, budget=budget)
            prediction = await program.arun_reply(question, reply, executor=caller.executor, budget=budget, check=check)
            return _recorded(entry, prediction)
        finally:
            if reservation is not None:
                spent = (prediction.cost, prediction.tokens) if prediction is not None else (0.0, 0)
                await ledger.database.run(lambda: self._settle(reservation, *spent))

    def _reserve(self, key: KeySpec, budget: Budget) -> Reservation:
        with storage("write the spend ledger"):
            return reserve(self.ledger, key, budget)

    def _settle(self, reservation: Reservation, cost: float, tokens: int) -> None:
        with storage("write the spend ledger"):
            self.ledger.settle(reservation, cost, tokens)


def _recorded(entry: AuditEntry, prediction: dspy.Prediction) -> dspy.Prediction:
    """``prediction``, its outcome and what it spent copied into ``entry``."""
    record(entry, prediction)
    entry.outcome = prediction.error.kind if prediction.error is not None else "ok"
    return prediction
