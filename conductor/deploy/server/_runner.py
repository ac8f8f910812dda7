"""One request's run, on a server thread: ``Conductor.ask`` and ``Conductor.run_reply`` under the caller's rules
(the day's spend reserved first, the workflow checked against the key's workers before any runs, the reservation
settled to the real spend), with the audit entry written whatever happened."""

import dataclasses
import time
from typing import Any

import dspy

from conductor.deploy._audit import AuditEntry, AuditLog
from conductor.deploy._governance import SpendLedger
from conductor.deploy.server._auth import Caller, check_workers
from conductor.deploy.server._schema import RequestError
from conductor.deploy.server._spend import OUTCOMES, record, reserve
from conductor.modules import Budget, Conductor, RunError, Workflow


@dataclasses.dataclass(frozen=True)
class Runner:
    """Runs requests for ``program`` under their caller's rules (on a server thread) and audits each one."""

    program: Conductor
    ledger: SpendLedger | None
    audit: AuditLog | None

    def __call__(self, caller: Caller, inputs: dict[str, Any], budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """Run one request and append what it did to the audit log, whatever happened. An audit log that can't be
        written fails the request: no answer goes out unrecorded."""
        program, started, prediction = self.program, time.perf_counter(), None
        try:
            question = program.question_text(inputs)
            if isinstance(question, RunError):
                prediction = program.no_answer(question)
            else:
                entry.question = question
                prediction = self._run(caller, question, budget, entry)
            entry.outcome = prediction.error.kind if prediction.error is not None else "ok"
            return prediction
        except RequestError as exc:
            entry.outcome, entry.error = OUTCOMES.get(exc.status, "error"), exc.message
            raise
        except Exception as exc:
            entry.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.audit is not None:
                if prediction is not None:
                    record(entry, prediction)
                entry.latency_s = time.perf_counter() - started
                self.audit.write(entry)

    def _run(self, caller: Caller, question: str, budget: Budget, entry: AuditEntry) -> dspy.Prediction:
        """``Conductor.forward`` with the caller's rules around it: the day's spend reserved first, the workflow (or
        the fallback) checked against the key's workers before any runs, the reservation settled to the real spend."""
        program = self.program
        reservation = reserve(self.ledger, caller.key, budget)
        prediction = None
        try:

            def check(workflow: Workflow, format_error: RunError | None) -> None:
                entry.workflow = workflow.to_text()
                check_workers(program.pool, caller.key, workflow, format_error)

            reply = program.ask(question, budget=budget)
            prediction = program.run_reply(question, reply, executor=caller.executor, budget=budget, check=check)
            return prediction
        finally:
            if reservation is not None:
                spent = (prediction.cost, prediction.tokens) if prediction is not None else (0.0, 0)
                self.ledger.settle(reservation, *spent)
