"""Teaching what the search found: warm-start examples on each training question's best candidate, by worker name,
over random pools, where a pool that can't run the winner is taught the best candidate it can run that has a chance
on the question (``SearchResult.prospects``), and a pool that can run none of those is drawn again."""

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
    subset and order of ``pool``, each workflow the first of the question's prospects
    (``SearchResult.prospects``: right most often on the questions like it, then right on it, then the cheaper) that
    the pool can run; a pool that can run none is drawn again, so a question is never taught a workflow that was right
    on no question like it. A question no candidate near it answers is taught ``overall``'s order: what does best on
    average. The full pool can run every candidate, so the draws end."""
    preferences = [
        (dict(example.inputs()), [candidate.steps for candidate in result.prospects(i)])
        for i, example in enumerate(result.examples)
    ]
    return preferred_workflows(
        pool, preferences, pools_per_question=pools_per_question, min_pool_size=min_pool_size, seed=seed
    )
