import itertools
import math
import re
import threading
import time

import dspy
import pytest

from conductor.errors import ConfigError, WorkerError
from conductor.modules import Budget, Completion, Executor, Price, Step, StepTrace, Usage, Worker, WorkerPool, Workflow
from conductor.signatures import Solve, Verify
from conductor.testing import ScriptedWorker


def no_sleep(_):
    pass


def pool_of(*workers):
    return WorkerPool(list(workers))


def test_prompt_holds_task_visible_steps_and_subtask_in_order():
    a = ScriptedWorker("a", itertools.repeat("first result"))
    b = ScriptedWorker("b", itertools.repeat("second result"))
    c = ScriptedWorker("c", itertools.repeat("final"))
    workflow = Workflow((Step(0, "do A"), Step(1, "do B", ()), Step(2, "combine", (0,))))
    result = Executor(pool_of(a, b, c)).run(workflow, "the task")
    assert result.answer == "final" and result.error is None
    prompt = c.prompts[0]
    assert prompt.index("the task") < prompt.index("do A") < prompt.index("first result") < prompt.index("combine")
    assert "second result" not in prompt  # step 2 may only see step 0
    assert "first result" not in b.prompts[0]  # step 1 sees nothing
    assert [s.visible for s in result.steps] == [(), (), (0,)]


def test_role_instructions_become_the_system_message():
    worker = ScriptedWorker("w")
    Executor(pool_of(worker)).run(Workflow((Step(0, "check it", role="verify"), Step(0, "go"))), "task")
    assert worker.messages[0][0] == {"role": "system", "content": Verify.instructions}
    assert worker.messages[1][0] == {"role": "system", "content": Solve.instructions}  # the default role


def test_trace_records_tokens_cost_and_latency():
    worker = ScriptedWorker("w", itertools.repeat("one two three"), price=Price(1.0, 2.0))
    result = Executor(pool_of(worker)).run(Workflow((Step(0, "go"),)), "task")
    step = result.steps[0]
    assert step.completion_tokens == 3 and step.prompt_tokens > 0
    assert step.cost == pytest.approx((step.prompt_tokens * 1.0 + 3 * 2.0) / 1000)
    assert result.cost == step.cost and result.tokens == step.prompt_tokens + 3
    assert step.latency_s >= 0 and step.attempts == 1


def test_a_failing_worker_is_retried_with_backoff_then_succeeds():
    sleeps = []
    flaky = ScriptedWorker("flaky", itertools.repeat("fine"), fail_times=2, retries=2)
    result = Executor(pool_of(flaky), sleep=sleeps.append, backoff_s=0.1).run(Workflow((Step(0, "go"),)), "t")
    assert result.answer == "fine" and flaky.calls == 3 and result.steps[0].attempts == 3
    assert len(sleeps) == 2 and sleeps[1] >= 0.2 * 0.99  # exponential: 0.1·2⁰+jitter, then 0.1·2¹+jitter


def test_a_worker_that_keeps_raising_stops_the_run_with_a_partial_result():
    good = ScriptedWorker("good", itertools.repeat("step zero done"))
    bad = ScriptedWorker("bad", fail_times=99, retries=1)
    never = ScriptedWorker("never")
    workflow = Workflow((Step(0, "a"), Step(1, "b"), Step(2, "c")))
    result = Executor(pool_of(good, bad, never), sleep=no_sleep).run(workflow, "t")
    assert result.answer is None
    assert result.error.kind == "execution" and "step 1 (bad) failed after 2 attempts" in result.error.message
    assert [s.output for s in result.steps] == ["step zero done", None]  # the partial result survives
    assert never.calls == 0 and bad.calls == 2


def test_a_hanging_worker_times_out_and_is_retried():
    slow = ScriptedWorker("slow", delay_s=5, timeout_s=0.2, retries=1)
    started = time.perf_counter()
    result = Executor(pool_of(slow), sleep=no_sleep).run(Workflow((Step(0, "go"),)), "t")
    assert time.perf_counter() - started < 2
    assert result.error.kind == "execution" and "did not answer within 0.2 s" in result.error.message
    assert slow.calls == 2


def test_a_worker_raising_a_foreign_exception_is_a_worker_failure():
    worker = ScriptedWorker("w", lambda _: 1 / 0, retries=0)
    result = Executor(pool_of(worker), sleep=no_sleep).run(Workflow((Step(0, "go"),)), "t")
    assert "ZeroDivisionError" in result.error.message


def test_step_budget_stops_before_the_extra_step():
    worker = ScriptedWorker("w")
    result = Executor(pool_of(worker)).run(Workflow((Step(0, "a"), Step(0, "b"))), "t", Budget(max_steps=1))
    assert worker.calls == 1 and result.error.kind == "budget" and result.answer is None


def test_token_budget_shrinks_max_tokens_and_is_never_exceeded():
    worker = ScriptedWorker("w", itertools.repeat("word " * 500), max_tokens=400)
    executor = Executor(pool_of(worker), min_output_tokens=1)
    workflow = Workflow((Step(0, "a"), Step(0, "b"), Step(0, "c")))
    result = executor.run(workflow, "t", Budget(max_tokens=300))
    assert result.tokens <= 300
    assert result.error.kind == "budget"  # the third step could not fit


def test_cost_budget_is_enforced_before_the_call():
    worker = ScriptedWorker("w", itertools.repeat("word " * 1000), price=Price(0.0, 10.0), max_tokens=1000)
    executor = Executor(pool_of(worker), min_output_tokens=1)
    result = executor.run(Workflow((Step(0, "a"), Step(0, "b"))), "t", Budget(max_cost=0.015))
    assert result.cost <= 0.015
    assert result.steps[0].completion_tokens == 1  # 0.015 $ buys 1 output token at $10/1K


class CountedWorker(Worker):
    """Answers at once with usage it reports itself, and counts how often its prompt tokens are counted."""

    def __init__(self, name):
        super().__init__(name)
        self.counted = 0

    def complete(self, messages, *, max_tokens, temperature):
        return Completion("done", 7, 1)

    def count_tokens(self, messages):
        self.counted += 1
        return 7


@pytest.mark.parametrize(
    ("budget", "counted"),
    [
        (Budget(), 0),
        (Budget(max_steps=5, max_tokens_per_step=50), 0),
        (Budget(max_tokens=500), 1),
        (Budget(max_cost=1.0), 1),
    ],
)
def test_a_prompt_is_counted_only_where_a_token_or_cost_limit_needs_it(budget, counted):
    worker = CountedWorker("w")  # counting is a tokenizer run for an API worker: CPU on every step, when done
    result = Executor(pool_of(worker)).run(Workflow((Step(0, "go"),)), "t", budget)
    assert worker.counted == counted
    assert result.answer == "done" and result.steps[0].prompt_tokens == 7  # what the call reported, either way


def test_budget_too_small_for_any_step_calls_nobody():
    worker = ScriptedWorker("w", price=Price(100.0, 100.0))
    result = Executor(pool_of(worker)).run(Workflow((Step(0, "a"),)), "t", Budget(max_cost=0.0001))
    assert worker.calls == 0 and result.error.kind == "budget" and result.steps == []


def test_worker_steps_appear_in_dspy_traces_for_optimizers():
    executor = Executor(pool_of(ScriptedWorker("w", itertools.repeat("hi"))))
    with dspy.context(trace=[]):
        executor.run(Workflow((Step(0, "a", role="plan"),)), "t")
        trace = dspy.settings.trace
    assert trace[0][0] is executor.roles["plan"] and trace[0][2].response == "hi"


def test_unknown_default_role_is_refused():
    with pytest.raises(ValueError, match="default role"):
        Executor(pool_of(ScriptedWorker("w")), default_role="nope")


def test_an_error_that_would_repeat_is_not_retried():
    from conductor.errors import ToolInputError

    def refuse(_):
        raise ToolInputError("no arithmetic expression found")

    worker = ScriptedWorker("calc", refuse, retries=3)
    result = Executor(pool_of(worker), sleep=no_sleep).run(Workflow((Step(0, "go"),)), "t")
    assert worker.calls == 1 and "failed after 1 attempts" in result.error.message


def test_a_worker_that_calls_sys_exit_fails_its_step_not_the_caller():
    def leave(_):
        raise SystemExit(3)

    worker = ScriptedWorker("quitter", leave, retries=0)
    result = Executor(pool_of(worker), sleep=no_sleep).run(Workflow((Step(0, "go"),)), "t")
    assert result.answer is None and "quitter: SystemExit: 3" in result.error.message


# ---- parallel steps ----------------------------------------------------------------------------------------------
class Concurrency:
    """A script that sleeps while it answers and records how many calls overlapped."""

    def __init__(self, answer, delay_s=0.05):
        self.answer, self.delay_s = answer, delay_s
        self.active = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, prompt):
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.delay_s)
        with self._lock:
            self.active -= 1
        return self.answer(prompt)


def facts(result):
    """Everything a run's result says except timings."""
    steps = [(s.index, s.worker, s.role, s.visible, s.output, s.prompt_tokens, s.completion_tokens, s.cost,
              s.attempts, s.answered_by, s.fallback_reason, s.error) for s in result.steps]  # fmt: skip
    return result.answer, result.error, steps, result.tokens, result.cost


def test_a_parallel_run_equals_the_sequential_run():
    workflow = Workflow(
        (
            Step(0, "first", ()),
            Step(1, "second", ()),
            Step(2, "third", (), role="plan"),
            Step(1, "join 0 and 1", (0, 1)),
            Step(0, "extend 2", (2,)),
            Step(2, "combine everything"),
        )
    )
    runs = {}
    for max_parallel in (1, 4):
        script = Concurrency(lambda p: f"read {len(p.split())} words ending {p.split()[-1]}", delay_s=0.02)
        pool = pool_of(
            ScriptedWorker("a", script, price=Price(1.0, 2.0)),
            ScriptedWorker("b", script, price=Price(0.5, 0.5)),
            ScriptedWorker("c", script),
        )
        with dspy.context(trace=[]):
            result = Executor(pool, max_parallel=max_parallel).run(workflow, "the task")
            dspy_trace = [(p.signature.__name__, inputs, out.toDict()) for p, inputs, out in dspy.settings.trace]
        runs[max_parallel] = facts(result), dspy_trace, script.peak
    assert runs[1][:2] == runs[4][:2]
    assert runs[1][0][1] is None and len(runs[1][1]) == 6
    assert runs[1][2] == 1 and runs[4][2] == 3  # steps 0-2 overlapped


def test_independent_steps_overlap_and_the_dependent_one_waits():
    busy_when_combining = []
    script = Concurrency(lambda p: busy_when_combining.append(script.active) or "done" if "combine" in p else "part")
    worker = ScriptedWorker("w", script)
    workflow = Workflow((*(Step(0, f"part {i}", ()) for i in range(4)), Step(0, "combine")))
    result = Executor(pool_of(worker), max_parallel=4).run(workflow, "t")
    assert result.answer == "done" and script.peak == 4 and worker.calls == 5
    assert busy_when_combining == [0]  # no part was still running


@pytest.mark.parametrize("limit", ["tokens", "cost"])
def test_steps_running_together_never_jointly_exceed_the_budget(limit):
    script = Concurrency(lambda p: "word " * 500, delay_s=0.02)
    worker = ScriptedWorker("w", script, max_tokens=100, price=Price(0.0, 1.0))
    workflow = Workflow((*(Step(0, f"part {i}", ()) for i in range(12)), Step(0, "combine")))
    budget = Budget(max_tokens=700) if limit == "tokens" else Budget(max_cost=0.45)
    result = Executor(pool_of(worker), max_parallel=8, min_output_tokens=10).run(workflow, "t", budget)
    assert script.peak > 1
    assert result.error.kind == "budget" and result.answer is None
    if limit == "tokens":
        assert result.tokens <= 700
    else:
        assert result.cost <= 0.45
    assert all(s.error is None for s in result.steps) and len(result.steps) < 12


def test_a_failed_step_stops_new_steps_and_running_ones_finish():
    slow = ScriptedWorker("slow", Concurrency(lambda p: "slow done", 0.15))
    broken = ScriptedWorker("broken", fail_times=99, retries=0)
    later = ScriptedWorker("later")
    workflow = Workflow((Step(1, "fails", ()), Step(0, "runs on", ()), Step(2, "never", ()), Step(2, "end")))
    result = Executor(pool_of(slow, broken, later), max_parallel=2).run(workflow, "t")
    assert later.calls == 0
    assert [(s.index, s.output) for s in result.steps] == [(0, None), (1, "slow done")]
    assert result.error.kind == "execution" and result.error.message.startswith("step 0 (broken)")


def test_the_error_reported_is_the_first_in_workflow_order():
    late = ScriptedWorker("late", Concurrency(lambda p: 1 / 0, 0.1), retries=0)
    early = ScriptedWorker("early", fail_times=99, retries=0)
    result = Executor(pool_of(late, early), max_parallel=2).run(Workflow((Step(0, "a", ()), Step(1, "b", ()))), "t")
    assert result.error.message.startswith("step 0 (late)") and len(result.steps) == 2


def test_a_step_over_budget_while_others_run_keeps_the_steps_before_it():
    worker = ScriptedWorker("w", Concurrency(lambda p: "ok", 0.02))
    workflow = Workflow(tuple(Step(0, f"part {i}", ()) for i in range(3)))
    result = Executor(pool_of(worker), max_parallel=3).run(workflow, "t", Budget(max_steps=2))
    assert [s.index for s in result.steps] == [0, 1] and worker.calls == 2
    assert result.error.kind == "budget" and result.error.message.startswith("step 2 not run")


def test_max_parallel_must_be_positive():
    with pytest.raises(ValueError, match="max_parallel"):
        Executor(pool_of(ScriptedWorker("w")), max_parallel=0)


def test_cost_is_attributed_to_workers_and_steps():
    a = ScriptedWorker("a", itertools.repeat("one two"), price=Price(0.0, 1.0))
    b = ScriptedWorker("b", itertools.repeat("one two three"), price=Price(0.0, 2.0))
    result = Executor(pool_of(a, b)).run(Workflow((Step(0, "x", ()), Step(1, "y", ()), Step(0, "z"))), "t")
    assert result.cost_by_step() == pytest.approx({0: 0.002, 1: 0.006, 2: 0.002})
    assert result.cost_by_worker() == pytest.approx({"a": 0.004, "b": 0.006})
    assert sum(result.cost_by_worker().values()) == pytest.approx(result.cost)


# ---- budgets: what a limit means, unknown prices, over-reports, the conductor's own spend --------------------------
class OverReporter(Worker):
    """Answers "ok" but reports ``extra_output`` more output tokens than it was allowed, or the provider cost
    ``cost``: a worker that breaks the contract."""

    def __init__(self, name, *, extra_output=0, cost=None, **kwargs):
        super().__init__(name, **kwargs)
        self.extra_output, self.reported_cost, self.calls = extra_output, cost, 0

    def complete(self, messages, *, max_tokens, temperature):
        self.calls += 1
        output = min(1, max_tokens) + self.extra_output if self.extra_output else 1
        return Completion("ok", self.count_tokens(messages), output, self.reported_cost)


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"max_cost": math.nan}, "max_cost must be finite"),
        ({"max_cost": math.inf}, "max_cost must be finite"),
        ({"max_tokens": -1}, "max_tokens must not be negative"),
        ({"max_cost": -0.01, "max_steps": -2}, "max_steps must not be negative; max_cost must not be negative"),
        ({"max_tokens_per_step": 1.5}, "max_tokens_per_step must be a whole number"),
        ({"max_steps": True}, "max_steps must be a whole number"),
        ({"max_cost": "1"}, "max_cost must be a number"),
    ],
)
def test_a_budget_refuses_limits_that_are_not_limits(limits, problem):
    with pytest.raises(ConfigError, match=f"invalid budget: {re.escape(problem)}"):
        Budget(**limits)


def test_zero_is_a_limit_of_zero_and_none_is_no_limit():
    assert Budget(max_steps=0, max_tokens=0, max_cost=0, max_tokens_per_step=0).max_tokens_per_step == 0
    worker = ScriptedWorker("w", itertools.repeat("word " * 50), max_tokens=100)
    capped = Executor(pool_of(worker)).run(Workflow((Step(0, "a"),)), "t", Budget(max_tokens_per_step=0))
    assert worker.calls == 0 and capped.error.kind == "budget" and "0 output tokens would fit" in capped.error.message
    at_zero = Executor(pool_of(worker), min_output_tokens=0).run(
        Workflow((Step(0, "a"),)), "t", Budget(max_tokens_per_step=0)
    )
    assert at_zero.steps[0].completion_tokens == 0  # capped at 0, not lifted to the worker's 100
    free = ScriptedWorker("free", itertools.repeat("fine"))  # a cost limit of $0 leaves free workers free
    assert Executor(pool_of(free)).run(Workflow((Step(0, "a"),)), "t", Budget(max_cost=0)).answer == "fine"
    unlimited = Executor(pool_of(worker)).run(Workflow((Step(0, "a"),)), "t", Budget(max_tokens_per_step=None))
    assert unlimited.steps[0].completion_tokens == 50


def test_a_worker_of_unknown_price_is_refused_under_a_cost_budget_before_any_call():
    priced = ScriptedWorker("priced", price=Price(1.0, 1.0))
    unknown = ScriptedWorker("mystery", price=None)
    workflow = Workflow((Step(0, "a", ()), Step(1, "b")))
    result = Executor(pool_of(priced, unknown)).run(workflow, "t", Budget(max_cost=1.0))
    assert priced.calls == unknown.calls == 0 and result.steps == [] and result.error.kind == "budget"
    assert "price of worker 'mystery' is unknown" in result.error.message and "give it a price" in result.error.message
    assert Executor(pool_of(priced, unknown)).run(workflow, "t", Budget(max_tokens=10_000)).error is None


def test_a_fallback_of_unknown_price_is_refused_too():
    pool = WorkerPool([ScriptedWorker("a", price=Price()), ScriptedWorker("b", price=None)], fallbacks={"a": ["b"]})
    result = Executor(pool).run(Workflow((Step(0, "go"),)), "t", Budget(max_cost=1.0))
    assert pool[0].calls == 0 and "'b' is unknown" in result.error.message


def test_a_worker_writing_more_than_it_was_allowed_stops_the_run_and_its_real_spend_is_recorded():
    greedy = OverReporter("greedy", extra_output=500, max_tokens=100)
    after = ScriptedWorker("after")
    result = Executor(pool_of(greedy, after)).run(Workflow((Step(0, "a"), Step(1, "b"))), "t", Budget(max_tokens=900))
    assert after.calls == 0 and result.answer is None and result.error.kind == "budget"
    assert "step 0 went over its reservation: greedy wrote 501 output tokens" in result.error.message
    step = result.steps[0]
    assert step.completion_tokens == 501 and step.error is not None and step.output == "ok"
    assert result.tokens == step.prompt_tokens + 501  # the true spend, though over the limit


def test_a_provider_cost_over_the_reservation_stops_the_run():
    executor = Executor(pool_of(OverReporter("pricey", cost=5.0, price=Price(1.0, 1.0))))
    result = executor.run(Workflow((Step(0, "a"),)), "t", Budget(max_cost=1.0))
    assert result.error.kind == "budget" and "pricey cost $5, more than the $" in result.error.message
    assert result.cost == 5.0 and result.steps[0].cost == 5.0
    # without a cost limit, a reported cost is only recorded
    assert executor.run(Workflow((Step(0, "a"),)), "t").error is None


def test_a_completion_with_impossible_usage_is_a_worker_error_not_retried():
    with pytest.raises(WorkerError) as negative:
        Completion("x", -1, 3)
    with pytest.raises(WorkerError):
        Completion("x", 1, 3, math.nan)
    assert negative.value.retryable is False


def test_the_budget_counts_from_what_the_conductor_already_spent():
    worker = ScriptedWorker("w", itertools.repeat("word " * 400), max_tokens=400, price=Price(0.0, 1.0))
    workflow = Workflow((Step(0, "a"),))
    conductor = Usage(prompt_tokens=200, completion_tokens=50, cost=0.1)
    result = Executor(pool_of(worker), min_output_tokens=1).run(
        workflow, "t", Budget(max_tokens=400, max_cost=1.0), conductor_usage=conductor
    )
    step = result.steps[0]
    assert step.prompt_tokens + step.completion_tokens <= 400 - 250  # the conductor's 250 tokens came first
    assert result.conductor_usage == conductor and result.tokens == 250 + step.prompt_tokens + step.completion_tokens
    assert result.cost == pytest.approx(0.1 + step.cost) and result.prompt_tokens == 200 + step.prompt_tokens
    spent_all = Executor(pool_of(worker)).run(workflow, "t", Budget(max_cost=0.05), conductor_usage=conductor)
    assert spent_all.error.kind == "budget" and spent_all.steps == [] and spent_all.cost == 0.1


def test_remaining_budget_subtracts_steps_and_the_conductor_s_spend_but_not_its_steps():
    step = StepTrace(0, 0, "w", "solve", "x", (), prompt_tokens=30, completion_tokens=20, cost=0.25)
    budget = Budget(max_steps=3, max_tokens=100, max_cost=1.0, max_tokens_per_step=7)
    left = budget.remaining([step], Usage(10, 5, 0.5))
    assert left == Budget(max_steps=2, max_tokens=35, max_cost=0.25, max_tokens_per_step=7)
    assert budget.remaining([step, step], Usage(100, 0, 2.0)) == Budget(1, 0, 0.0, 7)  # never below zero
    assert Usage(1, 2, 0.5) + Usage(3, 4, 0.25) == Usage(4, 6, 0.75)
