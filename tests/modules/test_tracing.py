import json
import subprocess
import sys

import dspy
import pytest
from dspy.utils.callback import BaseCallback
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conductor import MissingDependency
from conductor.modules import (
    Conductor,
    Executor,
    LMWorker,
    Price,
    Step,
    WorkerPool,
    Workflow,
    disable_tracing,
    enable_tracing,
    render_trace_html,
)
from conductor.testing import ScriptedWorker, scripted_lm


@pytest.fixture(autouse=True)
def tracing_off_afterwards():
    yield
    disable_tracing()


def in_memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def failover_pool() -> WorkerPool:
    workers = [
        ScriptedWorker("dead", fail_times=10**6, retries=0),
        ScriptedWorker("backup", lambda _: "backup answer", price=Price(1.0, 2.0)),
        ScriptedWorker("solver", lambda _: "<b>42</b>"),
    ]
    return WorkerPool(workers, fallbacks={"dead": ["backup"]})


FOUR_STEPS = Workflow((Step(0, "a", ()), Step(1, "b", ()), Step(2, "c", ()), Step(2, "combine")))


def test_spans_go_to_the_file_with_their_attributes_and_parents(tmp_path):
    path = tmp_path / "spans.jsonl"
    enable_tracing(file=path)
    result = Executor(failover_pool(), max_parallel=4).run(FOUR_STEPS, "q")
    disable_tracing()  # flushes the file

    spans = [json.loads(line) for line in path.read_text().splitlines()]
    (run,) = [s for s in spans if s["name"] == "conductor.run"]
    steps = sorted(
        (s for s in spans if s["name"] == "conductor.step"), key=lambda s: s["attributes"]["conductor.step.index"]
    )
    assert len(spans) == 5 and run["parent_id"] is None
    assert {s["parent_id"] for s in steps} == {run["context"]["span_id"]}
    assert {s["context"]["trace_id"] for s in steps} == {run["context"]["trace_id"]}
    assert run["attributes"]["gen_ai.usage.input_tokens"] == result.prompt_tokens
    assert run["attributes"]["conductor.cost_usd"] == pytest.approx(result.cost)
    for span, trace in zip(steps, result.steps, strict=True):
        attributes = span["attributes"]
        assert attributes["conductor.worker"] == trace.worker and attributes["conductor.role"] == trace.role
        assert attributes["conductor.answered_by"] == trace.answered_by
        assert attributes["gen_ai.usage.input_tokens"] == trace.prompt_tokens
        assert attributes["gen_ai.usage.output_tokens"] == trace.completion_tokens
        assert attributes["conductor.cost_usd"] == pytest.approx(trace.cost)
        assert attributes["conductor.latency_s"] == pytest.approx(trace.latency_s)
        assert attributes["conductor.attempts"] == trace.attempts
    assert steps[0]["attributes"]["conductor.answered_by"] == "backup"
    assert "dead: scripted failure 1" in steps[0]["attributes"]["conductor.fallback_reason"]
    assert "conductor.fallback_reason" not in steps[1]["attributes"]


def test_a_failed_step_marks_its_span_and_the_run_span_as_errors():
    provider, exporter = in_memory()
    enable_tracing(provider=provider)
    pool = WorkerPool([ScriptedWorker("ok"), ScriptedWorker("broken", fail_times=99, retries=0)])
    result = Executor(pool).run(Workflow((Step(0, "a"), Step(1, "b"))), "q")
    spans = {
        span.name + str(span.attributes.get("conductor.step.index", "")): span for span in exporter.get_finished_spans()
    }
    assert spans["conductor.step1"].status.is_ok is False
    assert spans["conductor.step1"].attributes["conductor.error"] == result.steps[1].error
    assert spans["conductor.run"].attributes["conductor.error"] == str(result.error)
    assert spans["conductor.step0"].status.is_ok


def test_the_run_span_nests_under_the_callers_span():
    provider, exporter = in_memory()
    enable_tracing(provider=provider)
    with provider.get_tracer("app").start_as_current_span("request") as request:
        Executor(failover_pool(), max_parallel=4).run(FOUR_STEPS, "q")
    by_name = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    (run,) = by_name["conductor.run"]
    assert run.parent.span_id == request.get_span_context().span_id
    assert {step.parent.span_id for step in by_name["conductor.step"]} == {run.context.span_id}


def test_with_tracing_off_no_span_is_created():
    provider, exporter = in_memory()
    enable_tracing(provider=provider)
    disable_tracing()
    Executor(failover_pool(), max_parallel=4).run(FOUR_STEPS, "q")
    assert exporter.get_finished_spans() == ()


def test_with_tracing_off_opentelemetry_is_never_imported():
    code = (
        "import sys\n"
        "from conductor.modules import Executor, Step, WorkerPool, Workflow\n"
        "from conductor.testing import ScriptedWorker\n"
        "pool = WorkerPool([ScriptedWorker('a'), ScriptedWorker('b')])\n"
        "steps = (Step(0, 'x', ()), Step(1, 'y', ()), Step(0, 'z'))\n"
        "assert Executor(pool).run(Workflow(steps), 'q').answer == 'ok'\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_opentelemetry_enable_tracing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(MissingDependency, match=r"dspy-conductor\[tracing\]"):
        enable_tracing()


class SeenLMs(BaseCallback):
    def __init__(self):
        self.models = []

    def on_lm_start(self, call_id, instance, inputs):
        self.models.append(instance.model)


@pytest.mark.parametrize("tracing", [False, True])
def test_dspy_callbacks_still_see_the_conductor_and_worker_lm_calls(tracing):
    if tracing:
        enable_tracing(provider=in_memory()[0])
    workflow = 'model_id = [0, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], []]'
    worker_lm = scripted_lm(lambda _: "from the worker LM", model="scripted/worker")
    pool = WorkerPool([LMWorker("lm", worker_lm), ScriptedWorker("tool")])
    seen = SeenLMs()
    with dspy.context(callbacks=[seen]):  # reaches the worker threads too: the executor copies the context
        prediction = Conductor(pool, scripted_lm([workflow]))(question="q")
    assert prediction.error is None and prediction.trace[0].output == "from the worker LM"
    assert sorted(seen.models) == ["scripted/conductor", "scripted/worker"]


def test_the_html_page_draws_the_chart_and_every_step_without_fetching_anything():
    pool = failover_pool()
    result = Executor(pool).run(FOUR_STEPS, "q")
    page = render_trace_html(result, pool)
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page and "<script" not in page and "mermaid" not in page
    assert "default-src 'none'" in page  # the browser refuses any load, should run text ever slip through
    assert page.count('<svg class="chart"') == 1 and page.count('<g class="step ') == 4
    assert '<g class="step fallback" data-index="0">' in page and "0 · dead · solve" in page
    assert "↪ answered by backup" in page and "sees all" in page and "sees none" in page
    assert page.count("<path ") == 3  # step 3 sees steps 0, 1 and 2
    assert page.count("<tr>") == 1 + len(result.steps)
    assert "&lt;b&gt;42&lt;/b&gt;" in page and "<b>42</b>" not in page  # outputs are escaped
    assert f"{result.steps[1].cost:.6f}" in page


def test_the_html_page_takes_a_prediction_and_marks_steps_not_run():
    pool = WorkerPool([ScriptedWorker("ok"), ScriptedWorker("broken", fail_times=99, retries=0)])
    workflow = 'model_id = [0, 1, 0]\nsubtasks = ["a", "b", "c"]\naccess_list = [[], "all", [1]]'
    prediction = Conductor(pool, scripted_lm([workflow]))(question="q")
    page = render_trace_html(prediction, pool)
    assert '<g class="step failed" data-index="1">' in page and "✗ failed: broken: scripted failure" in page
    assert '<g class="step not-run" data-index="2">' in page and "not run · sees 1" in page
    assert "execution error: step 1 (broken)" in page


def test_run_text_stays_text_in_the_chart_and_the_table():
    attack = "</text><script>alert(1)</script>"
    pool = WorkerPool([ScriptedWorker("ok", lambda _: attack), ScriptedWorker(attack, fail_times=99, retries=0)])
    result = Executor(pool).run(Workflow((Step(0, attack, ()), Step(1, f'"{attack}'))), "q")
    page = render_trace_html(result, pool)
    assert "<script" not in page and "<text>" not in page
    assert page.count("&lt;/text&gt;&lt;script&gt;alert(1)&lt;/script&gt;") >= 6  # subtasks, output, worker, error


def test_a_recursive_run_draws_each_round_with_only_the_steps_it_ran():
    self_last = 'model_id = [0, 2]\nsubtasks = ["solve it", "check it"]\naccess_list = [[], "all"]'
    fails = 'model_id = [1]\nsubtasks = ["solve it again"]\naccess_list = [[]]'
    pool = WorkerPool([ScriptedWorker("first"), ScriptedWorker("broken", fail_times=99, retries=0)])
    prediction = Conductor(pool, scripted_lm([self_last, fails]), max_depth=1)(question="q")
    assert prediction.rounds[1].workflow is prediction.rounds[0].workflow  # a round without an answer keeps it
    page = render_trace_html(prediction, pool)
    first, second = page.split("<h2>Round 2 of 2</h2>")
    assert "<h2>Round 1 of 2</h2>" in first and first.count('<g class="step ok"') == 1 and "solve it" in first
    assert second.count('<g class="step ') == 1 and '<g class="step failed" data-index="0">' in second
    assert "solve it again" in second and "solve it<" not in second


def test_a_round_that_ran_nothing_says_so():
    self_last = 'model_id = [0, 1]\nsubtasks = ["solve it", "check it"]\naccess_list = [[], "all"]'
    keep = "model_id = []\nsubtasks = []\naccess_list = []"
    pool = WorkerPool([ScriptedWorker("first")])
    prediction = Conductor(pool, scripted_lm([self_last, keep]), max_depth=1)(question="q")
    page = render_trace_html(prediction, pool)
    assert page.count('<svg class="chart"') == 1 and page.split("<h2>Round 2 of 2</h2>")[1].count("No steps ran.") == 1
