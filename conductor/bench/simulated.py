"""SIMULATED workers and tasks, calibrated to the Conductor paper, for fast, large studies without calling any model.

Everything here is marked: worker names and descriptions start with ``sim-``, questions with "SIMULATED", and task
families with ``sim/``, so no simulated number can pass for a measured one.

How it works (each rule is deliberately simple):

- **Tasks.** A task id ``<family>:<seed>:<index>`` fixes the whole task through a hash: the right answer (an integer),
  three distinct wrong answers and a difficulty in [0, 1). The question embeds the id, so a worker reads the truth
  out of the question itself: no registry, no shared state; ``simulated_task(id)`` recomputes a task anywhere.
- **Answering.** A worker with accuracy ``p`` on the task's family is right with probability ``p``: with probability
  ``correlation`` it is right exactly when the task's difficulty is below ``p`` (shared by every worker and sample,
  so hard tasks are hard for all, and voting gains less than independent draws would promise), otherwise by an
  independent draw. A wrong answer is one of the task's three wrong values, so wrong answers can agree, as on
  multiple choice.
- **Seeing earlier steps.** A step shown earlier answers (a verifier, an aggregator, any step with access) copies the
  most common of them (ties: the earliest) with probability ``copy_prob``, and otherwise answers as above.
- **Tokens and cost.** Output tokens are drawn per call, lognormal around the model's mean; a draw over ``max_tokens``
  is cut off and loses its "Answer:" line. Input tokens are the ``Worker``'s cautious estimate. The executor prices
  calls with the model's ``price``.
- **Randomness.** A call's draws are a function of (pool seed, worker, prompt) alone: results never depend on call
  order or threads, and a prompt asked again gets the same reply, as from a seeded sampler. Samples meant to differ
  need different prompts (``SelfConsistency`` numbers its samples). At temperature 0 a worker's own answer to a task
  is fixed whatever the prompt (greedy decoding); at any other temperature it varies with the prompt.

Calibration. The paper (``notes/paper.md``) gives no per-model, per-benchmark accuracies: only the best single
worker's average over MATH500 / MMLU / RLPR / LiveCodeBench in the controlled setting (Gemini 2.5 Pro, 64.14) and
GPT-5 with five rounds of self-reflection (64.52). ``PAPER_MODELS`` therefore holds **ASSUMED** accuracies, chosen so
that Gemini 2.5 Pro averages exactly 64.14 and is the best single worker, that the benchmarks keep the order of
difficulty of the Conductor's own scores (MMLU > MATH500 > LiveCodeBench > RLPR), and that different workers are
best on different benchmarks (as in a pool worth routing over). Prices (list prices as of 2025 for the API models,
typical hosting prices for the open ones) and mean output lengths are **ASSUMED** too. The default ``correlation``
(0.9) is set so that one-layer Mixture-of-Agents (7 proposers, Gemini aggregating) falls just below the best single
worker, as in the paper (62.13 vs 64.14): over 6,000 simulated questions MoA scored 63.3 and Gemini alone 63.8 (its
configured 64.14 within sampling error). The default ``copy_prob`` (0.5) is ASSUMED.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from conductor.bench.datasets import answer_text, exact_match, make_example
from conductor.errors import ConfigError, ToolInputError
from conductor.modules import Completion, Messages, Price, Worker, WorkerPool

PAPER_FAMILIES = ("math500", "mmlu", "rlpr", "livecodebench")
"""The controlled-setting benchmarks of the paper, as simulated task families."""

FAMILY_PREFIX = "sim/"
N_WRONG = 3  # distinct wrong answers per task, like the distractors of a 4-option question
_LENGTH_SIGMA = 0.5  # spread of the lognormal output length
_TASK_TAG = re.compile(r"\[sim-task (?P<id>[^\]\s]+)\]")
_EARLIER_ANSWER = re.compile(r"^Answer: (-?\d+)\s*$", re.M)


@dataclass(frozen=True)
class SimulatedModel:
    """A SIMULATED worker's profile: accuracy per task family, price, and mean output tokens per call."""

    name: str
    accuracy: Mapping[str, float]
    price: Price = field(default_factory=Price)
    mean_output_tokens: int = 400


def _paper_model(name: str, accuracies: tuple[float, ...], price: Price, mean_output_tokens: int) -> SimulatedModel:
    return SimulatedModel(name, dict(zip(PAPER_FAMILIES, accuracies, strict=True)), price, mean_output_tokens)


PAPER_MODELS: dict[str, SimulatedModel] = {
    m.name: m
    for m in (
        # ASSUMED numbers (see the module docstring); accuracies in PAPER_FAMILIES order, prices per 1K tokens.
        _paper_model("gemini-2.5-pro", (0.86, 0.90, 0.38, 0.4256), Price(0.00125, 0.010), 700),
        _paper_model("claude-sonnet-4", (0.80, 0.88, 0.36, 0.44), Price(0.003, 0.015), 500),
        _paper_model("gpt-5", (0.88, 0.89, 0.35, 0.40), Price(0.00125, 0.010), 400),
        _paper_model("deepseek-r1-distill-qwen-32b", (0.78, 0.80, 0.28, 0.30), Price(0.0003, 0.0003), 1800),
        _paper_model("gemma-3-27b", (0.70, 0.76, 0.22, 0.25), Price(0.0001, 0.0002), 350),
        _paper_model("qwen3-32b-thinking", (0.84, 0.82, 0.40, 0.38), Price(0.0001, 0.0003), 1500),
        _paper_model("qwen3-32b-direct", (0.72, 0.80, 0.27, 0.30), Price(0.0001, 0.0003), 400),
    )
}
"""The paper's pool of 7, SIMULATED with ASSUMED per-benchmark accuracies (Gemini 2.5 Pro's average is the paper's)."""


# ---- tasks ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimulatedTask:
    """A SIMULATED task; everything about it follows from ``id``."""

    id: str
    family: str
    answer: str
    wrong: tuple[str, ...]
    difficulty: float

    @property
    def question(self) -> str:
        return f"SIMULATED {self.family} question [sim-task {self.id}]. Give the answer as a whole number."


def simulated_task(task_id: str) -> SimulatedTask:
    """The task with id ``<family>:<seed>:<index>``: a hash of the id draws its answers and difficulty."""
    family, _, _ = task_id.rpartition(":")[0].rpartition(":")
    if not family:
        raise ConfigError(f"not a simulated task id: {task_id!r} (expected '<family>:<seed>:<index>')")
    rng = random.Random(hashlib.sha256(task_id.encode()).digest())
    answer, *wrong = (str(value) for value in rng.sample(range(100, 1000), 1 + N_WRONG))
    return SimulatedTask(task_id, family, answer, tuple(wrong), rng.random())


def simulated_dataset(families: Sequence[str] = PAPER_FAMILIES, n: int = 100, seed: int = 0) -> list[dspy.Example]:
    """``n`` SIMULATED questions per family, family by family; ``seed`` picks the tasks (the pool's seed is separate).

    Examples have the shape of the real loaders' (``question`` in; ``answer``, ``family`` labels, the family prefixed
    ``sim/``) plus ``task_id``; score them with ``simulated_metric``."""
    bad = [f for f in families if not f or re.search(r"[\s:\]]", f)]
    if bad:
        raise ConfigError(f"simulated family names can't be empty or hold spaces, ':' or ']': {bad}")
    tasks = [simulated_task(f"{family}:{seed}:{i}") for family in families for i in range(n)]
    return [make_example(t.question, t.answer, FAMILY_PREFIX + t.family, task_id=t.id) for t in tasks]


def simulated_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> float:
    """1.0 if the prediction's answer is the task's answer, else 0.0 (DSPy's metric signature)."""
    return float(exact_match(answer_text(prediction), [example.answer]))


# ---- workers -------------------------------------------------------------------------------------------------------
class SimulatedWorker(Worker):
    """A SIMULATED worker that answers simulated tasks with the accuracy of ``model`` (rules: module docstring).

    Args:
        model: accuracies per family, price and mean output length.
        seed: the pool's seed; with the worker's name and the prompt it fixes every draw. The worker holds no state,
            so it is thread-safe.
        copy_prob: chance that a step shown earlier answers copies their majority.
        correlation: share of a call's correctness decided by the task's difficulty rather than a fresh draw.
        kwargs: ``Worker`` settings; the defaults are the paper's (4,096 max tokens, temperature 0.2).
    """

    def __init__(
        self, model: SimulatedModel, *, seed: int = 0, copy_prob: float = 0.5, correlation: float = 0.9, **kwargs: Any
    ):
        for name, value in (("copy_prob", copy_prob), ("correlation", correlation), *model.accuracy.items()):
            if not 0 <= value <= 1:
                raise ConfigError(f"{model.name}: {name} must be a probability in [0, 1], not {value}")
        kwargs = {"max_tokens": 4096, "temperature": 0.2, "price": model.price, **kwargs}
        kwargs.setdefault("description", f"sim-{model.name}: a SIMULATED worker (no model is called)")
        super().__init__(f"sim-{model.name}", **kwargs)
        self.model = model
        self.seed = seed
        self.copy_prob = copy_prob
        self.correlation = correlation

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        prompt = messages[-1]["content"]
        tag = _TASK_TAG.search(prompt)
        if tag is None:
            raise ToolInputError(
                f"{self.name}: the prompt holds no simulated task (SIMULATED workers answer only those)"
            )
        task = simulated_task(tag["id"])
        accuracy = self.model.accuracy.get(task.family)
        if accuracy is None:
            raise ToolInputError(
                f"{self.name}: no accuracy for family {task.family!r} (knows {list(self.model.accuracy)})"
            )
        rng = self._rng(json.dumps(messages, sort_keys=True))
        solver = rng if temperature > 0 else self._rng(task.id)  # greedy: one answer per task, whatever the prompt
        copies = rng.random() < self.copy_prob
        shared, own, pick = solver.random(), solver.random(), solver.random()
        earlier = _EARLIER_ANSWER.findall(prompt[tag.end() :])
        if earlier and copies:
            answer = Counter(earlier).most_common(1)[0][0]  # equal counts keep the order first seen
        else:
            right = task.difficulty < accuracy if shared < self.correlation else own < accuracy
            answer = task.answer if right else task.wrong[int(pick * len(task.wrong))]
        length = self.model.mean_output_tokens * rng.lognormvariate(-(_LENGTH_SIGMA**2) / 2, _LENGTH_SIGMA)
        tokens = max(1, round(length))
        text = f"SIMULATED response of {self.name} to task {task.id}."
        if tokens > max_tokens:
            text, tokens = text + " (cut off: out of tokens)", max_tokens
        else:
            text += f"\nAnswer: {answer}"
        return Completion(text, self.count_tokens(messages), tokens)

    def _rng(self, key: str) -> random.Random:
        """A random source fixed by the pool's seed, this worker and ``key``."""
        return random.Random(f"{self.seed}\0{self.name}\0{key}")


def simulated_pool(
    models: Sequence[str | SimulatedModel] | None = None, seed: int = 0, **worker_kwargs: Any
) -> WorkerPool:
    """A pool of SIMULATED workers, by default the paper's 7 (``PAPER_MODELS``) in the paper's order.

    ``models`` may name ``PAPER_MODELS`` entries or give ``SimulatedModel``s; ``worker_kwargs`` (``copy_prob``,
    ``correlation``, ``max_tokens``, ...) go to every ``SimulatedWorker``."""
    chosen = list(PAPER_MODELS.values()) if models is None else list(models)
    unknown = [m for m in chosen if isinstance(m, str) and m not in PAPER_MODELS]
    if unknown:
        raise ConfigError(f"unknown simulated models {unknown}; known: {list(PAPER_MODELS)}")
    profiles = [PAPER_MODELS[m] if isinstance(m, str) else m for m in chosen]
    return WorkerPool([SimulatedWorker(profile, seed=seed, **worker_kwargs) for profile in profiles])
