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
    subset and order of ``pool``, each workflow the first candidate of the question's preferences
    (``SearchResult.preferences``: right before wrong, then cheaper, then better on questions like it) that the pool
    can run. A question no candidate answers is taught what does best on questions like it. Every single worker is a
    candidate, so every pool can run one."""
    preferences = [
        (dict(example.inputs()), [candidate.steps for candidate in result.preferences(i)])
        for i, example in enumerate(result.examples)
    ]
    return preferred_workflows(
        pool, preferences, pools_per_question=pools_per_question, min_pool_size=min_pool_size, seed=seed
    )
