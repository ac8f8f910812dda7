"""From unlabelled questions to a conductor that writes each kind's workflow: program search finds them, the warm
start teaches them to the real SmolLM2 conductor by worker name over random orders of the pool (slow: loads the
embedded model).

The pool and kinds are those of ``test_program_search.py`` (reverse, add, shout; the "shout" kind needs two steps).
Nothing tells the search or the warm start which question is of which kind, and no workflow is written by hand. The
measure is the share of sampled workflows (temperature 1, under the workflow grammar, over the full pool in its own
order) that answer right on questions training never saw, per kind: at least 0.9 for every kind.

Why 50 warm-start steps at 2e-3 (measured December 4 on the 2-core machine; each trained policy estimated with the
sampling seeds 0-3): 60 steps at 1e-3 left "shout" at 0.875-0.94, so the bar held on the seed below and failed on two
of the others (its misses mostly one step, ``reverse`` or ``shout`` alone). 50 steps at 2e-3, on three orders of the
batches (``WarmStartConfig.seed`` 0-2), gave "shout" 0.94-1.00 and the other kinds 1.00 on every seed, in less time.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("xgrammar")

from conductor.conductor_lm import LoraSpec, constraint_factory  # noqa: E402
from conductor.modules import Conductor, WorkerPool  # noqa: E402
from conductor.optimizers import (  # noqa: E402
    ProgramSearchConfig,
    WarmStartConfig,
    program_search,
    searched_workflows,
    warm_start,
)
from tests.conductor_lm.helpers import smollm2_or_skip  # noqa: E402
from tests.optimizers.kinds import FAMILIES, right, workers  # noqa: E402
from tests.optimizers.test_program_search import example  # noqa: E402

pytestmark = pytest.mark.slow

UNSEEN = range(1, 12, 3)
TRAINED_ON = [i for i in range(12) if i not in UNSEEN]
SAMPLES = 8
BAR = 0.9
MAX_TOKENS = 128


def test_the_searched_workflows_teach_the_conductor_every_kind(one_torch_thread: None) -> None:
    started = time.perf_counter()
    policy = smollm2_or_skip(lora=LoraSpec(r=8, alpha=16))
    pool = WorkerPool(workers())
    program = Conductor(pool, max_steps=2, worker_ids="names", fallback="none")
    program.orchestrate.signature = program.orchestrate.signature.with_instructions("Write a workflow.")
    trainset = [example(f, i) for i in TRAINED_ON for f in FAMILIES]  # mixed, and no family field

    result = program_search(program, trainset, right, ProgramSearchConfig(samples=0, first_rung=9))
    assert all(result.winner(i) is not None for i in range(len(trainset)))
    # every worker in every pool, in random orders: the conductor learns workers by name. (With subsets too,
    # min_pool_size=2, a third of the shout questions' pools lack a worker of its pair and teach a single step
    # instead; after 60 steps at 1e-3 "shout" was right in 0.41 of samples on the full pool: the fallbacks are tested
    # in test_program_search.py.)
    taught = searched_workflows(pool, result, pools_per_question=4, min_pool_size=3, seed=0)
    warm_start(policy, program, taught, WarmStartConfig(steps=50, batch_size=4, lr=2e-3, max_length=2048))

    grammar = constraint_factory(policy, MAX_TOKENS)(program, 0)
    after = {}
    for family in FAMILIES:
        unseen = [example(family, i) for i in UNSEEN]
        prompts = [program.prompt_messages(e.question) for e in unseen]
        rows = policy.sample(
            prompts, SAMPLES, max_new_tokens=MAX_TOKENS, temperature=1.0, seed=0, logits_processor=grammar
        )
        runs = [
            right(e, program.run_reply(e.question, program.read_completion(s.text)))
            for e, row in zip(unseen, rows, strict=True)
            for s in row
        ]
        after[family] = sum(runs) / len(runs)
    print(f"share right on unseen questions {after}; {time.perf_counter() - started:.0f} s in all")
    assert all(share >= BAR for share in after.values()), after
