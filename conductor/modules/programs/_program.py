"""``PoolProgram``: what every method that answers a user signature over a ``WorkerPool`` shares.

The Conductor and the baselines differ only in how they choose a workflow. Reading the question out of the user's
signature, the role predictors and executor, and the shape of the returned ``dspy.Prediction`` live here once, so an
experiment runner can treat every method alike.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator, Sequence
from typing import Any, Self, TypedDict

import dspy

from conductor.errors import ConfigError
from conductor.modules._answer import extract_answer
from conductor.modules.pool import WorkerPool
from conductor.modules.run import Budget, Executor, RunError, RunResult, Usage
from conductor.modules.workers import ReplayStore
from conductor.modules.workflow import Workflow
from conductor.signatures import BUILTIN_ROLES, role_name, role_problems

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: not text, and no model can encode it


class ProgramOptions(TypedDict, total=False):
    """The keyword arguments every ``PoolProgram`` accepts (see its docstring)."""

    signature: str | type[dspy.Signature]
    roles: Sequence[type[dspy.Signature]]
    budget: Budget
    max_parallel: int
    max_question_chars: int


class PoolProgram(dspy.Module):
    """Base of the programs that run workflows over ``pool`` to answer ``signature``.

    Every such program returns a ``dspy.Prediction`` with the user's output field(s) (read from the last step's
    response by ``extract_answer``), ``workflow``, ``trace`` (one ``StepTrace`` per step), ``tokens`` and ``cost``
    (every step's and the conductor LM's own), ``response`` (the raw answer text), ``conductor_text`` (``""`` without
    a conductor), ``conductor_usage`` (what the conductor LM spent, a ``Usage``), ``rounds`` (the conductor's rounds,
    ``[]`` without a conductor) and ``error`` (a ``RunError`` or ``None``).

    Args:
        pool: the workers, addressed by index.
        signature: the user's task signature; its inputs make the question, its outputs get the answer.
        roles: role signatures a step may take; the first is the default role. Their predictors are attributes of
            the program, so optimizers and save/load see them.
        budget: per-run limits on steps, tokens and cost.
        max_parallel: the most steps that run at once (steps that don't see each other may overlap; 1: none do).
        max_question_chars: longer questions are refused before any model is called.
    """

    def __init__(
        self,
        pool: WorkerPool,
        *,
        signature: str | type[dspy.Signature] = "question -> answer",
        roles: Sequence[type[dspy.Signature]] = BUILTIN_ROLES,
        budget: Budget = Budget(),
        max_parallel: int = 4,
        max_question_chars: int = 200_000,
    ):
        super().__init__()
        problems = [p for role in roles for p in role_problems(role)]
        if problems:
            raise ConfigError("; ".join(problems))
        self.pool = pool
        self.signature = dspy.ensure_signature(signature)
        self.max_question_chars = max_question_chars
        self.roles = {role_name(role): dspy.Predict(role) for role in roles}
        self.executor = Executor(
            pool, self.roles, default_role=role_name(roles[0]), budget=budget, max_parallel=max_parallel
        )

    def question_text(self, inputs: dict[str, Any]) -> str | RunError:
        """The question text made from the signature's input fields, or an ``input`` error."""
        missing = [name for name in self.signature.input_fields if name not in inputs]
        if missing:
            return RunError("input", f"missing input field(s): {missing}")
        fields = {name: inputs[name] for name in self.signature.input_fields}
        if len(fields) == 1:
            question = str(next(iter(fields.values())))
        else:
            question = "\n".join(f"{name}: {value}" for name, value in fields.items())
        if not question.strip():
            return RunError("input", "the question is empty")
        if surrogate := _LONE_SURROGATE.search(question):
            return RunError(
                "input",
                f"the question is not valid Unicode: a lone surrogate (U+{ord(surrogate[0]):04X}) at character "
                f"{surrogate.start():,}; no model can read it (was it decoded from bytes that are not UTF-8?)",
            )
        if len(question) > self.max_question_chars:
            return RunError(
                "input", f"the question has {len(question):,} characters; the limit is {self.max_question_chars:,}"
            )
        return question

    def copy_with(self, *, pool: WorkerPool | None = None, budget: Budget | None = None) -> Self:
        """A shallow copy over ``pool`` and/or with ``budget`` (``None``: this program's own). It shares this
        program's predictors (instructions, demos) and the workers themselves; its executor is a copy that runs the
        new pool within the new budget."""
        clone = copy.copy(self)
        clone.pool = self.pool if pool is None else pool
        clone.executor = copy.copy(self.executor)
        clone.executor.pool = clone.pool
        clone.executor.budget = self.executor.budget if budget is None else budget
        return clone

    def replaying_on(self, store: ReplayStore) -> Self:
        """A copy whose pool is rebuilt with its replay workers keeping their completions in ``store`` (a saved
        program names no store, so runs that should share worker samples attach one when they load it). This
        program's pool is closed."""
        pool = WorkerPool.from_config(self.pool.spec, replay_store=store)
        self.pool.close()
        return self.copy_with(pool=pool)

    @contextlib.contextmanager
    def lms_set_aside(self) -> Iterator[None]:
        """Its predictors without LMs while DSPy saves, loads or dumps their state: what a program learns is its
        prompts and demos; its LMs are rebuilt where it runs (a saved conductor LM is saved on its own, and DSPy
        refuses to rebuild a local model's LM from state). Not for a program that is running meanwhile."""
        lms = [(predictor, predictor.lm) for _, predictor in self.named_predictors()]
        for predictor, _ in lms:
            predictor.lm = None
        try:
            yield
        finally:
            for predictor, lm in lms:
                predictor.lm = lm

    def no_answer(self, error: RunError, text: str = "", conductor_usage: Usage = Usage()) -> dspy.Prediction:
        """The prediction of a run that ran no workflow: refused input, or no usable workflow and no fallback (with
        what the conductor LM spent, if it was asked)."""
        return self.make_prediction(RunResult(answer=None, error=error, conductor_usage=conductor_usage), None, text)

    def make_prediction(
        self,
        result: RunResult,
        workflow: Workflow | None,
        text: str = "",
        rounds: Sequence[dspy.Prediction] = (),
    ) -> dspy.Prediction:
        """The prediction every method returns; ``text`` is the conductor's raw output and ``rounds`` its rounds'
        predictions, if there was a conductor."""
        outputs = {}
        for name, output in self.signature.output_fields.items():
            raw = result.answer or ""
            outputs[name] = extract_answer(raw, output.annotation) if raw else raw
        return dspy.Prediction(
            **outputs,
            workflow=workflow,
            trace=result.steps,
            tokens=result.tokens,
            cost=result.cost,
            response=result.answer,
            conductor_text=text,
            conductor_usage=result.conductor_usage,
            rounds=list(rounds),
            error=result.error,
        )
