"""``Conductor``: a DSPy module that writes a workflow for each input and runs it over a worker pool.

Recursion (the paper's recursive rounds): with ``max_depth > 0`` the conductor is offered to itself as one more
worker, after the pool's. Naming itself as the last step's worker runs the steps before it, then starts a round in
which the conductor sees its workflow and the answer, and keeps the answer (empty lists) or writes a new workflow,
which may name itself again while rounds are left.

A run is a coroutine (``aforward``, under ``await program.acall(...)``): an API conductor LM's call and API workers'
calls are awaited on the event loop, so a run over API models holds no thread, while an in-process conductor LM (it
blocks) writes on a daemon thread. The sync entry points (``forward``, ``ask``, ``ask_revision``, ``run_reply``) run
the same coroutines (``run_sync``), so the logic exists once.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError, LMError
from dspy.utils.usage_tracker import UsageTracker, track_usage

from conductor.errors import ConductorError, ConfigError, WorkflowError, invalid_config
from conductor.modules import _threads
from conductor.modules.pool import WorkerPool
from conductor.modules.programs._config import ConductorConfig, named_role
from conductor.modules.programs._program import PoolProgram, ProgramOptions
from conductor.modules.run import Budget, Executor, RunError, RunResult, Usage
from conductor.modules.workers import Price, context_window, lm_price, prompt_tokens
from conductor.modules.workflow import DIRECT_SUBTASK, Limits, Step, Workflow, WorkflowAdapter
from conductor.signatures import Orchestrate, Revise

logger = logging.getLogger(__name__)

Check = Callable[[Workflow, RunError | None], None]

SELF_DESCRIPTION = (
    "yourself, the conductor (only as the last step): review the final answer and rewrite the workflow if it is wrong"
)
"""How the conductor sees itself in the worker list while a recursive round is left."""

SELF_NAME = "conductor"
"""The conductor's own name in a workflow that names workers (``worker_ids="names"``)."""


class ConductorReply(NamedTuple):
    """The conductor's completion for one round, read: a runnable workflow, or ``None`` and the ``error`` (a format
    error, or a budget too small for the conductor's own call), and what the conductor LM spent writing it."""

    workflow: Workflow | None
    text: str
    error: RunError | None
    usage: Usage = Usage()


class ConductorPredict(dspy.Predict):
    """The conductor's predictor. Its LM is the conductor LM, part of the program rather than of its learned state, so
    it is kept where DSPy would drop a predictor's LM: ``reset()`` (DSPy's optimizers ``reset_copy()`` their student
    and teacher) and loading a state saved without an LM. Copies share it (``deepcopy``), as they share the pool: it
    may hold a loaded model."""

    def reset(self) -> None:
        lm = self.__dict__.get("lm")  # absent while Predict.__init__ runs
        super().reset()
        self.lm = lm

    def load_state(self, state: dict, *, allow_unsafe_lm_state: bool = False) -> ConductorPredict:
        lm = self.lm
        super().load_state(state, allow_unsafe_lm_state=allow_unsafe_lm_state)
        self.lm = self.lm or lm
        return self

    def __deepcopy__(self, memo: dict) -> ConductorPredict:
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update({k: v if k == "lm" else copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return clone


AskRevision = Callable[[str, Workflow, dspy.Prediction, int], ConductorReply]
"""How a recursive round asks the conductor: ``(question, previous workflow, previous round's prediction, depth)``
to the reply (``Conductor.ask_revision`` by default; GRPO samples the policy there instead)."""


class Conductor(PoolProgram):
    """For each input, the conductor LM writes a workflow over ``pool``; the executor runs it.

    Returns the prediction every ``PoolProgram`` returns (the user's output field(s), ``workflow``, ``trace``,
    ``tokens``, ``cost``, ``response``, ``error``), with ``conductor_text`` holding the conductor's raw output.
    ``error.kind == "format"`` tells a workflow the conductor got wrong from a run that executed but failed.

    A run in several rounds (see the module docstring) returns the answer of the last round that gave one, with
    ``workflow`` the workflow that gave it, ``trace``, ``tokens`` and ``cost`` over all rounds, ``conductor_text``
    the first round's, ``error`` the last round's, and ``rounds``: one prediction per round, as the run would have
    returned had it stopped there, except that its ``trace``, ``tokens`` and ``cost`` are the round's own.

    Args:
        pool: the workers, addressed by index.
        lm: the conductor LM (any ``dspy.LM``); ``None`` uses ``dspy.settings.lm``.
        **options: ``ConductorConfig``'s fields: ``max_steps``, ``max_depth``, ``fallback``, ``signature``,
            ``roles``, ``budget``, ``max_parallel``, ``max_question_chars``.
    """

    def __init__(self, pool: WorkerPool, lm: dspy.LM | None = None, **options: Any):
        try:
            config = ConductorConfig(**options)
        except pydantic.ValidationError as exc:
            raise invalid_config("invalid Conductor options", exc, "(options)") from None
        # Set before the roles, so named_predictors() lists the conductor first.
        self.orchestrate = ConductorPredict(Orchestrate)
        self.orchestrate.lm = lm
        self.max_depth = config.max_depth
        super().__init__(pool, **{name: getattr(config, name) for name in ProgramOptions.__annotations__})
        self.limits = Limits(max_steps=config.max_steps)
        self.fallback = config.fallback
        self.worker_ids = config.worker_ids

    @classmethod
    def from_config(cls, config: ConductorConfig, pool: WorkerPool, lm: dspy.LM | None = None) -> Conductor:
        """A new program with ``config``'s options over ``pool``; its prompts and demos are the defaults until
        DSPy state is loaded into it (``load_state``)."""
        return cls(pool, lm, **dict(config))

    def config(self) -> ConductorConfig:
        """This program's options as they are now (optimizers change limits and budgets in place). Its prompts and
        demos are not options but DSPy state (``dump_state``)."""
        return ConductorConfig(
            signature=self.signature,
            max_steps=self.limits.max_steps,
            max_depth=self.max_depth,
            fallback=self.fallback,
            worker_ids=self.worker_ids,
            roles=tuple(named_role(name, predictor.signature) for name, predictor in self.roles.items()),
            budget=self.executor.budget,
            max_parallel=self.executor.max_parallel,
            max_question_chars=self.max_question_chars,
        )

    @property
    def max_depth(self) -> int:
        """The most recursive rounds a run may add."""
        return self._max_depth

    @max_depth.setter
    def max_depth(self, depth: int) -> None:
        # The ``revise`` predictor exists only while it can be called, so a program without recursion saves, loads
        # and is optimized as before.
        if depth < 0:
            raise ConfigError(f"max_depth must be at least 0, not {depth}")
        self._max_depth = depth
        if depth and "revise" not in self.__dict__:
            self.revise = ConductorPredict(Revise)
        elif not depth:
            self.__dict__.pop("revise", None)

    @property
    def own_id(self) -> int:
        """The worker number by which the conductor chooses itself: the one after the pool's."""
        return len(self.pool)

    @property
    def decoding_constraint(self) -> Any | None:
        """The logits processor its LM decodes under (the workflow grammar a local conductor gets from
        ``conductor_lm.constrain_program``), or ``None``: read from the LM, so a grammar is known without torch."""
        return getattr(getattr(self.orchestrate.lm, "engine", None), "logits_processor", None)

    @property
    def workflow_names(self) -> tuple[str, ...] | None:
        """The names its workflows give workers (``names[i]`` is worker i; the conductor's own, ``SELF_NAME``, last
        when it may recurse), or ``None`` when they number them (``worker_ids="numbers"``)."""
        if self.worker_ids == "numbers":
            return None
        names = tuple(self.pool.names)
        if SELF_NAME in (name.lower() for name in names):
            raise ConfigError(f"no worker may be named {SELF_NAME!r} where workflows name workers: it is the conductor")
        return (*names, SELF_NAME) if self.max_depth else names

    def workflow_text(self, workflow: Workflow) -> str:
        """``workflow`` as this conductor writes it (its workers by number or by name)."""
        return workflow.to_text(self.workflow_names)

    def forward(self, **inputs: Any) -> dspy.Prediction:
        return _threads.run_sync(self.aforward(**inputs))

    async def aforward(self, **inputs: Any) -> dspy.Prediction:
        """The run under ``await program.acall(...)``: API models are awaited on the event loop, blocking ones run on
        daemon threads (see the module docstring), so the loop stays free."""
        question = self.question_text(inputs)
        if isinstance(question, RunError):
            return self.no_answer(question)
        return await self.arun_reply(question, await self.aask(question, budget=self.executor.budget))

    # ---- what the conductor LM sees, and how its completion is read ---------------------------------------------
    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages the conductor LM gets for ``question`` in the first round (what ``ask`` sends)."""
        return self._messages(self.orchestrate, self._inputs(0, question=question))

    def revision_messages(
        self, question: str, workflow: Workflow, previous: dspy.Prediction, depth: int
    ) -> list[dict[str, str]]:
        """The chat messages of recursive round ``depth`` (1 the first): ``question``, the ``workflow`` the conductor
        wrote and the ``previous`` round's prediction (what ``ask_revision`` sends)."""
        return self._messages(self.revise, self._revision_inputs(question, workflow, previous, depth))

    def read_completion(self, completion: str, depth: int = 0) -> ConductorReply:
        """Read the conductor's ``completion`` in round ``depth`` (0: the first) into a workflow that may run then;
        format problems are returned in ``ConductorReply.error``, never raised."""
        try:
            workflow = Workflow.parse(completion, self.workflow_names)
        except WorkflowError as exc:
            return ConductorReply(None, completion, RunError("format", str(exc)))
        return self._checked(workflow, completion, depth)

    def _checked(self, workflow: Workflow, completion: str, depth: int) -> ConductorReply:
        problems = self.workflow_problems(workflow, depth)
        if problems:
            return ConductorReply(None, completion, RunError("format", str(WorkflowError(problems))))
        return ConductorReply(workflow, completion, None)

    def workflow_problems(self, workflow: Workflow, depth: int = 0) -> list[str]:
        """Why ``workflow`` may not run in round ``depth`` (empty: it may). A recursive round may write no steps (keep
        the answer); the conductor may only be the last step's worker, after at least one other, while a round is
        left."""
        limits = dataclasses.replace(self.limits, allow_empty=depth > 0)
        n_workers = len(self.pool) + (1 if self.max_depth else 0)
        found = workflow.problems(n_workers, limits, set(self.roles))
        for i, step in enumerate(workflow.steps if self.max_depth else ()):
            if step.worker != self.own_id:
                continue
            me = f"step {i}: {SELF_NAME if self.workflow_names else f'Model {step.worker}'} is you, the conductor"
            if i < len(workflow) - 1:
                found.append(f"{me}: you may only do the last step")
            elif i == 0:
                found.append(f"{me}: a worker must answer before you review the answer")
            elif depth >= self.max_depth:
                found.append(f"{me}, and no recursive round is left (max_depth={self.max_depth})")
        return found

    # ---- asking the conductor LM --------------------------------------------------------------------------------
    def ask(self, question: str, *, budget: Budget | None = None) -> ConductorReply:
        """``aask`` from sync code."""
        return _threads.run_sync(self.aask(question, budget=budget))

    async def aask(self, question: str, *, budget: Budget | None = None) -> ConductorReply:
        """The first round: ``prompt_messages`` go to the conductor LM through the ``orchestrate`` predictor, and
        ``read_completion`` reads what it writes. Within ``budget``, the conductor's own call may write only what
        the run's token and cost limits leave (see ``_ask``)."""
        return await self._ask(self.orchestrate, 0, self._inputs(0, question=question), budget)

    def ask_revision(
        self, question: str, workflow: Workflow, previous: dspy.Prediction, depth: int, *, budget: Budget | None = None
    ) -> ConductorReply:
        """``aask_revision`` from sync code."""
        return _threads.run_sync(self.aask_revision(question, workflow, previous, depth, budget=budget))

    async def aask_revision(
        self, question: str, workflow: Workflow, previous: dspy.Prediction, depth: int, *, budget: Budget | None = None
    ) -> ConductorReply:
        """Recursive round ``depth`` (1 the first), through the ``revise`` predictor: the conductor sees its
        ``workflow`` and the ``previous`` round's answer; an empty workflow keeps that answer."""
        inputs = self._revision_inputs(question, workflow, previous, depth)
        return await self._ask(self.revise, depth, inputs, budget)

    def _inputs(self, depth: int, **fields: Any) -> dict[str, Any]:
        """The predictor's inputs in round ``depth``: ``fields`` and what every round shows (workers, roles, steps)."""
        return {
            "workers": self._workers_text(depth),
            "available_roles": ", ".join(self.roles),
            "max_steps": self.limits.max_steps,
            **fields,
        }

    def _revision_inputs(
        self, question: str, workflow: Workflow, previous: dspy.Prediction, depth: int
    ) -> dict[str, Any]:
        answer = previous.response if previous.response is not None else f"(no answer: {previous.error})"
        text = self.workflow_text(workflow)
        return self._inputs(depth, question=question, previous_workflow=text, previous_answer=answer)

    def _messages(self, predictor: dspy.Predict, inputs: dict[str, Any]) -> list[dict[str, str]]:
        """What ``predictor`` sends for ``inputs``: its signature and demos, formatted as ``_ask`` formats them."""
        return WorkflowAdapter(self.workflow_names).format(predictor.signature, predictor.demos, inputs)

    async def _ask(
        self, predictor: dspy.Predict, depth: int, inputs: dict[str, Any], budget: Budget | None
    ) -> ConductorReply:
        """Call the conductor LM through ``predictor`` (so DSPy traces, callbacks, demos and instructions apply) and
        read its completion for round ``depth``. A predictor uses its own LM if it has one (``constrain_program``
        gives ``revise`` the grammar of the recursive rounds), else ``orchestrate``'s, and the sampling settings of
        ``orchestrate``. The call's tokens and cost are the reply's ``usage``: they count in the run's budget like
        any step's, so under ``budget`` the call may write no more than its limits leave, and one that can't fit (or
        can't be priced under a cost limit) is not made. An API model's call is awaited; any other LM (an
        in-process model, a custom ``BaseLM``) blocks, so it is called on a daemon thread."""
        lm = predictor.lm or self.orchestrate.lm or dspy.settings.lm
        config = dict(self.orchestrate.config)
        price = lm_price(lm) if lm is not None else None
        if lm is not None:
            messages = self._messages(predictor, inputs)
            limit = _beyond_context(lm, messages)
            if limit is None and budget is not None:
                limit = _output_limit(lm, price, messages, budget, config)
            if isinstance(limit, RunError):
                return ConductorReply(None, "", limit)
            if limit is not None:
                config["max_tokens"] = limit
        # One adapter per call: it keeps this call's raw completion, safe under concurrency.
        adapter = WorkflowAdapter(self.workflow_names)
        trace = dspy.settings.trace
        traced = len(trace) if trace is not None else 0
        # On unreadable text the adapter raises, having kept the completion: read_completion reports the problems.
        with track_usage() as tracker, dspy.context(adapter=adapter), contextlib.suppress(AdapterParseError):
            try:
                if isinstance(getattr(lm, "engine", None), str):  # "auto", "litellm", "lm15": a provider's API
                    await predictor.acall(**inputs, lm=lm, config=config)
                else:
                    await _threads.on_thread(functools.partial(predictor, **inputs, lm=lm, config=config))
            except LMError as exc:  # no key, no connection, a provider's refusal: not the question's fault
                model = getattr(lm, "model", lm)
                raise ConductorError(f"the conductor LM {model!r} failed: {str(exc).splitlines()[0]}") from exc
        if adapter.workflow is not None:  # parsed already: the adapter had to, to give DSPy the output fields
            reply = self._checked(adapter.workflow, adapter.completion, depth)
        else:
            reply = self.read_completion(adapter.completion, depth)
        reply = reply._replace(usage=_usage(tracker, price))
        if reply.workflow is None and trace is not None:
            del trace[traced:]  # a workflow that can't run (an unknown worker) must not become an optimizer's demo
        return reply

    def _workers_text(self, depth: int) -> str:
        """The worker list the conductor sees in round ``depth``: the pool, and itself while a round is left."""
        by_name = self.worker_ids == "names"
        pool = self.pool.describe(by_name)
        if depth >= self.max_depth:
            return pool
        return f"{pool}\n{SELF_NAME if by_name else f'Model {self.own_id}'}: {SELF_DESCRIPTION}"

    # ---- running what the conductor wrote -----------------------------------------------------------------------
    def run_reply(
        self,
        question: str,
        reply: ConductorReply,
        *,
        executor: Executor | None = None,
        budget: Budget | None = None,
        check: Check | None = None,
        ask_revision: AskRevision | None = None,
    ) -> dspy.Prediction:
        """``arun_reply`` from sync code."""
        return _threads.run_sync(
            self.arun_reply(question, reply, executor=executor, budget=budget, check=check, ask_revision=ask_revision)
        )

    async def arun_reply(
        self,
        question: str,
        reply: ConductorReply,
        *,
        executor: Executor | None = None,
        budget: Budget | None = None,
        check: Check | None = None,
        ask_revision: AskRevision | None = None,
    ) -> dspy.Prediction:
        """Run the first round's ``reply``: the conductor's workflow, or the fallback when it was unusable; then the
        recursive rounds it asks for, each asked through ``ask_revision`` (default: ``self.aask_revision``; a given
        one may block, so it is called on a daemon thread), all within ``budget``.

        ``check`` sees each workflow about to run (and the format error, if it is the fallback) before any worker is
        called, and may raise to refuse it; a server uses it to enforce per-key permissions.
        """
        executor = executor or self.executor
        budget = budget or executor.budget
        unusable = reply.error is not None and reply.error.kind == "format"
        to_run = reply.workflow or (self.fallback_workflow() if unusable else None)
        if to_run is None:
            first = self.no_answer(reply.error, reply.text, reply.usage)
        else:
            result = await self._execute(to_run, question, executor, budget, check, reply.error, reply.usage)
            if reply.error is not None:
                result.error = reply.error  # the fallback answered, but the conductor's own workflow was unusable
            first = self.make_prediction(result, result.workflow, reply.text)
        rounds, used = [first], reply.usage
        while self._calls_itself(reply.workflow):
            left = budget.remaining([step for done in rounds for step in done.trace], conductor_usage=used)
            depth = len(rounds)
            if ask_revision is None:
                reply = await self.aask_revision(question, reply.workflow, rounds[-1], depth, budget=left)
            else:
                reply = await _threads.on_thread(
                    functools.partial(ask_revision, question, reply.workflow, rounds[-1], depth)
                )
            rounds.append(await self._revision(question, reply, rounds[-1], executor, left, check))
            used += reply.usage
        last = rounds[-1]
        steps = [step for done in rounds for step in done.trace]
        return self.make_prediction(
            RunResult(last.response, steps, last.error, conductor_usage=used),
            last.workflow,
            first.conductor_text,
            rounds,
        )

    def _calls_itself(self, workflow: Workflow | None) -> bool:
        return bool(self.max_depth and workflow and workflow.steps[-1].worker == self.own_id)

    async def _execute(
        self,
        workflow: Workflow,
        question: str,
        executor: Executor,
        budget: Budget,
        check: Check | None,
        format_error: RunError | None = None,
        conductor_usage: Usage = Usage(),
    ) -> RunResult:
        """Run ``workflow``'s worker steps (all but a last step naming the conductor), counting from what the
        conductor spent writing it."""
        if self._calls_itself(workflow):
            workflow = Workflow(workflow.steps[:-1], workflow.reasoning)
        if check is not None:
            check(workflow, format_error)
        return await executor.arun(workflow, question, budget, conductor_usage=conductor_usage)

    async def _revision(
        self,
        question: str,
        reply: ConductorReply,
        previous: dspy.Prediction,
        executor: Executor,
        budget: Budget,
        check: Check | None,
    ) -> dspy.Prediction:
        """Run a recursive round's ``reply``. Its workflow's answer replaces the ``previous`` one; with no answer
        (kept, unusable, or a run that failed) the previous answer stands, and the round's error is recorded."""
        if reply.workflow is None:
            steps, error = [], reply.error
        elif not reply.workflow.steps:
            steps, error = [], previous.error
        else:
            result = await self._execute(reply.workflow, question, executor, budget, check, conductor_usage=reply.usage)
            if result.answer is not None:
                return self.make_prediction(result, result.workflow, reply.text)
            steps, error = result.steps, result.error
        result = RunResult(previous.response, steps, error, conductor_usage=reply.usage)
        return self.make_prediction(result, previous.workflow, reply.text)

    def save(
        self, path: str | os.PathLike[str], save_program: bool = False, modules_to_serialize: list | None = None
    ) -> None:
        """DSPy's own save: the state (prompts, demos) as ``.json`` or ``.pkl``, or with ``save_program`` the whole
        program in the folder ``path``. A deployable folder (pool config, options, the conductor LM) is written by
        ``conductor.save(program, path)``."""
        if not save_program and not str(path).endswith((".json", ".pkl")):
            raise ConductorError(
                f"{path} is not a .json or .pkl state file: write a deployable program folder with "
                "conductor.save(program, path) (conductor.load reads it), or pass save_program=True for DSPy's own"
            )
        super().save(path, save_program=save_program, modules_to_serialize=modules_to_serialize)

    def fallback_workflow(self) -> Workflow | None:
        """What runs when the conductor's workflow is unusable (``None``: nothing runs)."""
        if self.fallback == "none":
            return None
        return Workflow((Step(0, DIRECT_SUBTASK, ()),))


def _beyond_context(lm: dspy.BaseLM, messages: list[dict[str, str]]) -> RunError | None:
    """The ``input`` error of a prompt that can't fit the conductor LM's context window, when that is known."""
    window = context_window(lm)
    # A token is at least one UTF-8 byte (at most 4 a character), plus a few per message: most prompts need no count.
    if window is None or sum(4 * len(m["content"]) + 16 for m in messages) < window:
        return None
    tokens = prompt_tokens(lm, messages)
    if tokens < window:
        return None
    return RunError(
        "input",
        f"the question is too long for the conductor: its prompt has {tokens:,} tokens and the conductor LM "
        f"{lm.model!r} takes at most {window:,}",
    )


def _output_limit(
    lm: dspy.BaseLM, price: Price | None, messages: list[dict[str, str]], budget: Budget, config: dict[str, Any]
) -> int | RunError | None:
    """The most tokens the conductor's own call may write within ``budget`` (``None``: no limit applies), or the
    ``budget`` error why it can't be made at all."""
    if budget.max_tokens is None and budget.max_cost is None:
        return None
    if budget.max_cost is not None and price is None:
        return RunError(
            "budget",
            f"the conductor LM {lm.model!r} has no known price (litellm's cost map doesn't list it), so it can't run "
            f"under a cost budget of ${budget.max_cost:g}",
        )
    prompt = prompt_tokens(lm, messages)
    limit = config.get("max_tokens") or lm.kwargs.get("max_tokens") or math.inf
    if budget.max_tokens is not None:
        limit = min(limit, budget.max_tokens - prompt)
    if budget.max_cost is not None and price is not None:
        left = budget.max_cost - price.cost(prompt, 0)
        if price.output_per_1k > 0:
            limit = min(limit, math.floor(max(left, 0) * 1000 / price.output_per_1k))
        elif left < 0:
            limit = 0
    if limit < 1:
        return RunError("budget", f"the conductor's own call ({prompt} prompt tokens) doesn't fit the budget {budget}")
    return None if limit == math.inf else int(limit)


def _usage(tracker: UsageTracker, price: Price | None) -> Usage:
    """What the conductor LM's calls recorded in ``tracker`` spent (an unknown price counts as $0: only runs without
    a cost budget get that far)."""
    totals = tracker.get_total_tokens().values()
    prompt = sum(int(t.get("prompt_tokens") or 0) for t in totals)
    completion = sum(int(t.get("completion_tokens") or 0) for t in totals)
    return Usage(prompt, completion, price.cost(prompt, completion) if price is not None else 0.0)
