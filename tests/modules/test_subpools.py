"""One way to run a program over other workers or within another budget: ``WorkerPool.subset`` and
``PoolProgram.copy_with``."""

import pytest

from conductor import ConfigError
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm

ONE_STEP = 'model_id = [0]\nsubtasks = ["answer"]\naccess_list = [[]]'
CONFIG = {
    "workers": [
        {"name": "a", "kind": "tool", "tool": "calculator", "fallbacks": ["b", "c"]},
        {"name": "b", "kind": "tool", "tool": "calculator", "fallbacks": ["c"]},
        {"name": "c", "kind": "tool", "tool": "calculator"},
    ]
}


def test_a_subset_keeps_the_chosen_workers_in_its_order_with_fallbacks_among_them():
    pool = WorkerPool.from_config(CONFIG)
    sub = pool.subset([2, 0])
    assert sub.names == ["c", "a"] and sub[0] is pool[2] and sub[1] is pool[0]  # the same objects
    assert sub.fallbacks == {"a": ("c",)}
    assert [(w.name, w.fallbacks) for w in sub.spec.workers] == [("c", []), ("a", ["c"])]
    assert sub.describe() == "Model 0\nModel 1"


def test_a_subset_may_limit_failover_to_some_workers_and_refuses_repeats():
    pool = WorkerPool.from_config(CONFIG)
    same = pool.subset(range(3), fallback_to=["a", "b"])
    assert same.names == pool.names and same.fallbacks == {"a": ("b",)}
    with pytest.raises(ConfigError, match="unique"):
        pool.subset([0, 0])


def test_a_copy_runs_its_own_pool_within_its_own_budget_and_leaves_the_program_alone():
    workers = [ScriptedWorker(name, lambda _, name=name: name) for name in ("x", "y")]
    program = Conductor(WorkerPool(workers), scripted_lm([ONE_STEP] * 3))
    over_y = program.copy_with(pool=program.pool.subset([1]))
    assert over_y(question="q").response == "y" and program(question="q").response == "x"
    assert over_y.orchestrate is program.orchestrate  # the same prompts and demos
    tight = program.copy_with(budget=Budget(max_tokens_per_step=7))  # under the executor's minimum of 16
    assert tight.pool is program.pool and tight(question="q").error.kind == "budget"
    assert program.executor.budget == Budget() and program.executor.pool is program.pool
