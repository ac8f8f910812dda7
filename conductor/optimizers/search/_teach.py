"""Teaching what the search found: warm-start examples on each training question's best candidate, by worker name,
over random pools, where a pool that can't run the winner is taught the best candidate it can run."""

from __future__ import annotations

from conductor.modules import WorkerPool
from conductor.optimizers.finetune import TrainingExample, preferred_workflows
from conductor.optimizers.search._search import SearchResult


def searched_workflows(
    pool: WorkerPool,
    result: SearchResult,
    *,
    pools_per_question: int = 4,
    min_pool_size: int = 1,
    seed: int = 0,
) -> list[TrainingExample]:
    """``pools_per_question`` ``(inputs, workflow, pool)`` examples per question of ``result``: each pool a random
    subset and order of ``pool``, each workflow the first candidate right on the question, in its preferences' order
    (``SearchResult.preferences``: right before wrong, then cheaper, then better on questions like it), that the pool
    can run; a pool that can run none of them is drawn again (the whole pool runs the winner).

    Only candidates right on the question are taught, never a wrong one because a pool lacks the winner's worker:
    on issue 25's ablation those fallbacks (navigate questions taught `gemma -> check` where a pool lacked SmolLM2,
    arithmetic ones SmolLM2 alone where it lacked Gemma) were 20-40% of a kind's examples, and the conductor learned
    the mixture, sending 23 of 50 navigate test questions to the arithmetic workflow. A question no candidate
    answers is taught only what does best on questions like it (``preferences``' first), in the pools that hold it."""
    preferences = []
    for i, example in enumerate(result.examples):
        ranked = result.preferences(i)
        row = result.outcomes[i]
        right = [c for c in ranked if c.name in row and row[c.name].score > 0]
        preferences.append((dict(example.inputs()), [candidate.steps for candidate in right or ranked[:1]]))
    return preferred_workflows(
        pool, preferences, pools_per_question=pools_per_question, min_pool_size=min_pool_size, seed=seed
    )
