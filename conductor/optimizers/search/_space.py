"""The space program search scores: candidate workflows made from the pool.

A candidate names its workers (``TemplateStep``), so it keeps its meaning in any subset and order of the pool: that is
what lets the warm start teach it over random pools, and fall back to the next candidate a pool can run.

The shapes are those that multi-agent systems and the oracle study use (AFlow's operators, the paper's workflows):

- each worker alone, with each first-step instruction (the default, answer directly, and any the user gives), and
  each model with each instruction the search proposes about the answer's form (a tool computes its answer as it
  is, so told the form it would answer the same);
- each model asked the question alone, as a user would ask it (``"smollm2 (plain)"``: its subtask is
  ``QUESTION_ALONE``), and each pair it opens so asked (``"smollm2 (plain) -> check"``): the conductor writes that
  subtask per step, so which questions a model answers better asked plain, and in which workflows, is the search's
  to find per question;
- each worker, then each worker that sees it and checks it (a tool as it is; a model told to verify, or to refine);
- ``k`` answers of one model, then each worker that sees them all combines them (a vote or check tool, or a model):
  self-consistency and Mixture-of-Agents in small.

Every step runs in the program's default role; what a step is for is in its subtask. The workflows the search finds
are what the conductor is taught to write, and the grammar it is sampled under has no ``roles`` list.

The first step of a pair is a single candidate's own step, word for word, so over a ``ReplayWorker`` pool the pair
reuses the single worker's answer: what a checker adds is measured on the same sample (a paired comparison).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conductor.modules import ToolWorker, WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK, QUESTION_ALONE
from conductor.optimizers.finetune import TemplateStep

DIRECT = DIRECT_SUBTASK  # the library's own single-worker step, so a fallback shares its replayed answer too
CHECK = "Check the answer above and give the final answer."
REFINE = "Improve the answer above and give the final answer."
COMBINE = "Give the final answer the candidates above support best."


@dataclass(frozen=True)
class Candidate:
    """One workflow of the search space, by worker name. ``name`` is unique in the space and reads as the shape
    (``"gemma -> check"``, ``"smollm2 x3 -> vote"``, ``"gemma (plain)"``: asked the question alone)."""

    name: str
    steps: tuple[TemplateStep, ...]


def candidate_space(
    pool: WorkerPool,
    *,
    subtasks: Sequence[str] = (DIRECT,),
    proposed: Sequence[str] = (),
    samples: int = 3,
    max_steps: int = 5,
    pairs: bool = True,
    plain: bool = True,
) -> list[Candidate]:
    """Every candidate of the shapes above over ``pool``, at most ``max_steps`` steps each, in a fixed order (singles
    first, then the models asked the question alone). ``subtasks`` are the first-step instructions tried (the
    first is the one the longer shapes open with), ``proposed`` more of them tried on the models only;
    ``samples`` below 2 leaves out the sample-then-combine shapes; ``pairs=False`` the worker-then-checker ones;
    ``plain=False`` the models and pairs opened by a model asked the question alone."""
    names, models = pool.names, [w.name for w in pool if not isinstance(w, ToolWorker)]
    out = []
    for name in names:
        tried = [*subtasks, *(s for s in proposed if name in models and s not in subtasks)]
        out += [_single(name, subtask, i, len(tried)) for i, subtask in enumerate(tried)]
    if plain:
        out += [Candidate(f"{model} (plain)", (_direct(model, QUESTION_ALONE),)) for model in models]
    if pairs and max_steps >= 2:
        first = subtasks[0]
        for answerer in names:
            for checker in names:
                if checker == answerer and checker not in models:
                    continue  # a tool checking itself recomputes what it just computed
                for subtask, what in _second_steps(checker in models):
                    steps = (_direct(answerer, first), TemplateStep(worker=checker, subtask=subtask))
                    out.append(Candidate(f"{answerer} -> {checker}{what}", steps))
                    if plain and answerer in models:  # its first step asked the question alone
                        alone = (_direct(answerer, QUESTION_ALONE), steps[1])
                        out.append(Candidate(f"{answerer} (plain) -> {checker}{what}", alone))
    if 2 <= samples < max_steps:
        for model in models:
            drafts = tuple(_sample(model, subtasks[0], i, samples) for i in range(samples))
            for combiner in names:
                step = TemplateStep(worker=combiner, subtask=COMBINE)
                out.append(Candidate(f"{model} x{samples} -> {combiner}", (*drafts, step)))
    return out


def _direct(worker: str, subtask: str) -> TemplateStep:
    return TemplateStep(worker=worker, subtask=subtask, access=())


def _single(worker: str, subtask: str, index: int, of: int) -> Candidate:
    suffix = f" [{index + 1}]" if of > 1 else ""
    return Candidate(f"{worker}{suffix}", (_direct(worker, subtask),))


def _sample(worker: str, subtask: str, index: int, of: int) -> TemplateStep:
    """One of ``of`` independent answers: the first is the single worker's own step; the others say which
    candidate they are, so each is its own prompt (a replaying pool would answer a repeated prompt the same)."""
    return _direct(worker, subtask if index == 0 else f"{subtask} (Candidate {index + 1} of {of}.)")


def _second_steps(is_model: bool) -> list[tuple[str, str]]:
    """(subtask, name suffix) of each way a worker can follow an answer: a tool checks as it is; a model verifies
    or refines."""
    return [(CHECK, " (verify)"), (REFINE, " (refine)")] if is_model else [(CHECK, "")]
