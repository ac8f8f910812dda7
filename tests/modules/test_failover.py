import copy
import pickle
import threading

import pytest

from conductor import ConfigError
from conductor.errors import ToolInputError
from conductor.modules import Budget, Executor, Price, Step, WorkerHealth, WorkerPool, Workflow
from conductor.testing import ScriptedWorker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def no_sleep(_):
    pass


ONE_STEP = Workflow((Step(0, "go"),))


def failover_pool(primary: ScriptedWorker, *fallbacks: ScriptedWorker) -> WorkerPool:
    return WorkerPool([primary, *fallbacks], fallbacks={primary.name: [w.name for w in fallbacks]})


def executor(pool: WorkerPool, clock: Clock, **health) -> Executor:
    return Executor(pool, health=WorkerHealth(clock=clock, **health), sleep=no_sleep)


def test_a_worker_that_fails_every_call_is_cooled_down_and_its_fallback_answers():
    clock = Clock()
    dead, backup = ScriptedWorker("dead", fail_times=10**6, retries=2), ScriptedWorker("backup", lambda _: "fine")
    run = executor(failover_pool(dead, backup), clock, failure_threshold=3, cooldown_s=30).run

    first = run(ONE_STEP, "q")
    assert first.answer == "fine" and first.error is None
    step = first.steps[0]
    assert (step.worker, step.answered_by, step.attempts) == ("dead", "backup", 4)  # 3 on dead, 1 on backup
    assert "dead: scripted failure 3" in step.fallback_reason
    assert dead.calls == 3 and backup.calls == 1

    clock.now += 5  # while it cools down, later runs go straight to the fallback
    second = run(ONE_STEP, "q")
    assert dead.calls == 3 and backup.calls == 2
    assert second.steps[0].answered_by == "backup" and second.steps[0].attempts == 1
    assert second.steps[0].fallback_reason == "dead is cooling down (25.0 s left)"
    assert second.cost_by_worker() == {"backup": second.cost}


def test_the_breaker_stops_retries_as_soon_as_it_opens():
    dead, backup = ScriptedWorker("dead", fail_times=10**6, retries=5), ScriptedWorker("backup")
    result = executor(failover_pool(dead, backup), Clock(), failure_threshold=2).run(ONE_STEP, "q")
    assert dead.calls == 2 and result.steps[0].answered_by == "backup"


def test_a_flapping_worker_comes_back_after_its_cooldown():
    clock = Clock()
    flaky = ScriptedWorker("flaky", lambda _: "back", fail_times=2, retries=0)
    backup = ScriptedWorker("backup", lambda _: "stand-in")
    ex = executor(failover_pool(flaky, backup), clock, failure_threshold=2, window_s=60, cooldown_s=10)

    assert [ex.run(ONE_STEP, "q").answer for _ in range(3)] == ["stand-in"] * 3
    assert flaky.calls == 2  # two failures cooled it down; the third run did not call it
    assert ex.health.cooldown_left("flaky") == 10

    clock.now += 11
    result = ex.run(ONE_STEP, "q")
    assert result.answer == "back" and flaky.calls == 3
    assert result.steps[0].answered_by == "flaky" and result.steps[0].fallback_reason is None


def test_a_worker_that_fails_again_after_its_cooldown_is_cooled_down_at_once():
    clock = Clock()
    dead, backup = ScriptedWorker("dead", fail_times=10**6, retries=0), ScriptedWorker("backup")
    ex = executor(failover_pool(dead, backup), clock, failure_threshold=3, cooldown_s=30)
    for _ in range(3):
        ex.run(ONE_STEP, "q")
    clock.now += 31
    ex.run(ONE_STEP, "q")
    assert dead.calls == 4 and ex.health.cooldown_left("dead") == 30  # one failure on probation is enough


def test_failures_outside_the_window_do_not_add_up():
    clock = Clock()
    health = WorkerHealth(failure_threshold=2, window_s=10, clock=clock)
    health.record_failure("w")
    clock.now += 11
    health.record_failure("w")
    assert health.cooldown_left("w") == 0
    health.record_failure("w")
    assert health.cooldown_left("w") > 0


def test_all_workers_failing_gives_a_clear_error_with_the_partial_trace():
    clock = Clock()
    good = ScriptedWorker("good", lambda _: "step zero done")
    primary, spare = (ScriptedWorker(name, fail_times=10**6, retries=0) for name in ("primary", "spare"))
    pool = WorkerPool([good, primary, spare], fallbacks={"primary": ["spare"]})
    ex = executor(pool, clock, failure_threshold=1)
    workflow = Workflow((Step(0, "a"), Step(1, "b"), Step(0, "c")))

    result = ex.run(workflow, "q")
    assert result.answer is None and result.error.kind == "execution"
    assert result.error.message.startswith("step 1 (primary) failed after 2 attempts: ")
    assert "primary: scripted failure 1" in result.error.message and "spare: scripted failure 1" in result.error.message
    assert [(s.output, s.answered_by) for s in result.steps] == [("step zero done", "good"), (None, None)]
    assert good.calls == 1  # step 2 never started

    again = ex.run(workflow, "q")  # both are cooling down now: nobody is called
    assert primary.calls == 1 and spare.calls == 1
    assert again.steps[1].attempts == 0
    assert again.error.message == (
        "step 1 (primary) failed after 0 attempts: "
        "primary is cooling down (30.0 s left); spare is cooling down (30.0 s left)"
    )


def test_an_error_that_would_repeat_goes_to_the_fallback_but_does_not_count_against_health():
    def refuse(_):
        raise ToolInputError("no arithmetic expression found")

    calc, lm = ScriptedWorker("calc", refuse, retries=3), ScriptedWorker("lm", lambda _: "42")
    ex = executor(failover_pool(calc, lm), Clock(), failure_threshold=1)
    result = ex.run(ONE_STEP, "q")
    assert result.answer == "42" and calc.calls == 1
    assert result.steps[0].fallback_reason == "calc: no arithmetic expression found"
    assert ex.health.cooldown_left("calc") == 0


def test_a_fallback_that_does_not_fit_the_budget_is_passed_over():
    dead = ScriptedWorker("dead", fail_times=10**6, retries=0)
    pricey = ScriptedWorker("pricey", price=Price(1000.0, 1000.0))
    cheap = ScriptedWorker("cheap", lambda _: "cheap answer")
    ex = executor(failover_pool(dead, pricey, cheap), Clock())
    result = ex.run(ONE_STEP, "q", Budget(max_cost=0.01))
    assert result.answer == "cheap answer" and pricey.calls == 0
    assert "pricey does not fit the budget" in result.steps[0].fallback_reason


def test_fallbacks_are_checked_in_code_and_in_config():
    with pytest.raises(ConfigError, match="'a' falls back to 'zzz', which is not in the pool"):
        WorkerPool([ScriptedWorker("a")], fallbacks={"a": ["zzz"]})
    with pytest.raises(ConfigError, match="can't fall back to itself"):
        WorkerPool([ScriptedWorker("a")], fallbacks={"a": ["a"]})
    config = {
        "workers": [
            {"name": "calc", "kind": "tool", "tool": "calculator", "fallbacks": ["py"]},
            {"name": "py", "kind": "tool", "tool": "python"},
        ]
    }
    assert WorkerPool.from_config(config).fallbacks == {"calc": ("py",)}
    config["workers"][1]["fallbacks"] = ["nope"]
    with pytest.raises(ConfigError, match="'py' falls back to 'nope'"):
        WorkerPool.from_config(config)


def test_a_pickled_health_record_starts_from_the_record_as_it_was():
    health = WorkerHealth(failure_threshold=2)
    health.record_failure("w")
    revived = pickle.loads(pickle.dumps(health))
    revived.record_failure("w")  # its second failure: the copy kept the first
    assert revived.cooldown_left("w") > 0 and health.cooldown_left("w") == 0


def test_health_is_shared_by_copies_and_safe_across_threads():
    health = WorkerHealth(failure_threshold=50, window_s=1e9)
    assert copy.deepcopy(health) is health
    threads = [threading.Thread(target=lambda: [health.record_failure("w") for _ in range(10)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert health.cooldown_left("w") > 0  # 80 failures from 8 threads, none lost past the threshold of 50
