"""Prompt search for the ``Conductor`` (instructions and few-shot workflows), done by DSPy's own optimizers.

``WorkflowFewShot`` searches the conductor's few-shot example workflows (the paper's most damaging ablation:
LiveCodeBench fell from 64.3 to 54.9 without them) with ``dspy.BootstrapFewShotWithRandomSearch``. ``PromptSearch``
searches the instructions of the conductor and of the worker roles (and the few-shot workflows) with
``dspy.MIPROv2``, or with ``dspy.GEPA`` when a reflection LM is given. DSPy's optimizers run unchanged, and they
also compile a ``Conductor`` as they are (the conductor LM survives ``reset_copy``, labeled demos are left out of the
prompts, bootstrapped demos are workflows: see ``conductor.modules``). These wrappers add what a stock optimizer can't
know about the Conductor:

- ``WorkflowMetric`` (``_metric.py``, shared with budget tuning and the compiler): only a run whose own workflow ran
  counts as a success while bootstrapping. (A workflow that can't run never becomes a demo anyway, but with a stock
  metric the run the fallback answered still gives its worker step as a role demo, and ``threshold`` turns a graded
  metric into DSPy's pass or fail.) A metric that raises is reported before the search starts instead of scoring
  every candidate 0;
- settings that fit: no labeled demos (they would take demo slots and show nothing), the candidate sets worth trying,
  and the conductor's LM as MIPROv2's task model and as the default LM while searching;
- checked inputs: a non-Conductor student, an empty trainset or valset, a program without an LM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import dspy
from dspy.teleprompt import Teleprompter

from conductor.errors import ConfigError
from conductor.modules import Conductor
from conductor.optimizers._metric import WorkflowMetric
from conductor.optimizers._optuna import import_optuna
from conductor.optimizers._rewards import Metric

logger = logging.getLogger(__name__)


class WorkflowFewShot(Teleprompter):
    """Few-shot example workflows for the conductor: ``dspy.BootstrapFewShotWithRandomSearch`` on the Conductor.

    The student runs on ``trainset``; a run whose own workflow executed and scored at least ``threshold`` (1: right)
    becomes an ``Orchestrate`` demo (the question, the pool and roles it saw, and that workflow's lists). DSPy then
    tries the no-demo baseline, the first ``k`` such demos (the paper used 4) and ``num_candidates`` seeded random
    sets of 1 to ``k`` demos, and keeps the set with the best validation score (``valset``, else ``trainset``); on a
    tie the baseline or the earlier set stays. The result's ``candidate_programs`` lists every set's score.

    DSPy also bootstraps the other predictors a successful run called, so the worker roles get demos (each step's
    response) from the same runs.
    """

    def __init__(
        self,
        metric: Metric,
        *,
        k: int = 4,
        num_candidates: int = 8,
        threshold: float = 1.0,
        num_threads: int | None = None,
    ):
        if k < 1 or num_candidates < 0:
            raise ConfigError(f"k must be at least 1 and num_candidates at least 0, not {k} and {num_candidates}")
        self.metric = metric
        self.k = k
        self.num_candidates = num_candidates
        self.threshold = threshold
        self.num_threads = num_threads

    def compile(
        self, student: Conductor, *, trainset: Sequence[dspy.Example], valset: Sequence[dspy.Example] | None = None
    ) -> Conductor:
        metric = WorkflowMetric(self.metric, self.threshold)
        search = dspy.BootstrapFewShotWithRandomSearch(
            metric=metric,
            max_bootstrapped_demos=self.k,
            max_labeled_demos=0,
            num_candidate_programs=self.num_candidates,
            num_threads=self.num_threads,
        )
        # Candidate -2 is "labeled demos only": with none allowed it would repeat the baseline (-3).
        restrict = [-3, *range(-1, self.num_candidates)]
        return _search(student, trainset, valset, metric, lambda _: search, restrict=restrict)


class PromptSearch(Teleprompter):
    """Instructions of the conductor and the worker roles, and the conductor's few-shot workflows, searched by
    ``dspy.MIPROv2`` (instructions proposed by ``prompt_model``, combinations chosen by Optuna's TPE on validation
    score), or by ``dspy.GEPA`` (instructions rewritten by ``reflection_lm`` from failed runs) when one is given.

    ``options`` go to the DSPy optimizer's constructor, with ``auto="light"`` unless given (e.g. ``num_threads``,
    ``seed``, ``max_bootstrapped_demos`` for MIPROv2; ``auto=None, max_metric_calls=200`` for GEPA). MIPROv2 runs
    without labeled demos and with the conductor's LM as its task model. Without ``valset``, MIPROv2 holds part of
    ``trainset`` out and GEPA validates on ``trainset``, as DSPy does.

    Role instructions are searched too: a copy of the program runs its steps with the copy's role predictors.
    """

    def __init__(
        self,
        metric: Metric,
        *,
        prompt_model: dspy.LM | None = None,
        reflection_lm: dspy.LM | None = None,
        threshold: float = 1.0,
        **options: Any,
    ):
        self.metric = metric
        self.prompt_model = prompt_model
        self.reflection_lm = reflection_lm
        self.threshold = threshold
        self.options = {"auto": "light", **options}

    def compile(
        self, student: Conductor, *, trainset: Sequence[dspy.Example], valset: Sequence[dspy.Example] | None = None
    ) -> Conductor:
        metric = WorkflowMetric(self.metric, self.threshold)
        if self.reflection_lm is not None:
            return _search(
                student,
                trainset,
                valset,
                metric,
                lambda _: dspy.GEPA(metric=metric, reflection_lm=self.reflection_lm, **self.options),
            )
        import_optuna("Instruction search with MIPROv2")
        prompt_model = self.prompt_model or dspy.settings.lm
        if prompt_model is None:
            raise ConfigError("PromptSearch needs a prompt_model (or reflection_lm, or dspy.configure(lm=...))")

        def mipro(conductor_lm: dspy.LM) -> Teleprompter:
            return dspy.MIPROv2(
                metric=metric, prompt_model=prompt_model, task_model=conductor_lm, max_labeled_demos=0, **self.options
            )

        return _search(student, trainset, valset, metric, mipro)


def _search(
    student: Conductor,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example] | None,
    metric: WorkflowMetric,
    optimizer: Callable[[dspy.LM], Teleprompter],
    **compile_options: Any,
) -> Conductor:
    """Check the inputs, then run ``optimizer(conductor_lm).compile`` on a copy of ``student`` with the conductor's
    LM as the default LM (the result keeps the student's own LM, or none if it used the default)."""
    if not isinstance(student, Conductor):
        raise ConfigError(f"the student must be a Conductor, not {type(student).__name__}")
    if not trainset:
        raise ConfigError("the trainset is empty: prompt search needs examples to run the conductor on")
    if valset is not None and not valset:
        raise ConfigError("the valset is empty: pass None to validate on the trainset")
    lm = student.orchestrate.lm or dspy.settings.lm
    if lm is None:
        raise ConfigError("the conductor has no LM: pass lm= to the Conductor or call dspy.configure(lm=...)")
    with dspy.context(lm=lm):
        metric.check(student, trainset[0])
        fresh = student.deepcopy()
        fresh._compiled = False  # DSPy refuses to bootstrap a compiled student; a compiler searches again
        result = optimizer(lm).compile(
            fresh, trainset=list(trainset), valset=list(valset) if valset is not None else None, **compile_options
        )
    logger.info("prompt search done: %d conductor demos", len(result.orchestrate.demos))
    return result
