import pytest
from hypothesis import given
from hypothesis import strategies as st

from conductor.errors import WorkflowError
from conductor.modules import Limits, Step, Workflow

PAPER_STYLE = """<think>The question needs a plan, then code.</think>
Let me split this.
model_id: [2, 0, 1]
subtasks: ["Plan the solution", 'Write code for "step [1]"', "Check it"]
access_list: [[], "all", [0, 1]]
"""


def test_parses_the_papers_format_and_drops_think():
    workflow = Workflow.parse(PAPER_STYLE)
    assert [s.worker for s in workflow.steps] == [2, 0, 1]
    assert workflow.steps[1].subtask == 'Write code for "step [1]"'
    assert [s.access for s in workflow.steps] == [(), "all", (0, 1)]
    assert workflow.reasoning == "Let me split this."


@pytest.mark.parametrize(
    "text, workers",
    [
        ('model_id = [0, 1]\nsubtasks = ["a", "b"]\naccess_list = [[], "all"]', [0, 1]),
        ('{"model_id": [0, 1], "subtasks": ["a", "b"], "access_list": [[], "all"]}', [0, 1]),  # JSON
        ('**model_id**: ["Model 0", "model 1"]\n**subtasks**: [a, b]\n**access_list**: [none, all]', [0, 1]),  # split
        ("model_id=[1.0, 0]\nsubtasks=['a', 'b']\naccess_list=[[], 'ALL']", [1, 0]),
    ],
)
def test_tolerant_forms(text, workers):
    assert [s.worker for s in Workflow.parse(text).steps] == workers


def test_a_name_inside_a_subtask_is_not_a_field():
    text = 'model_id = [0]\nsubtasks = ["explain what access_list = [1] means"]\naccess_list = ["all"]'
    assert Workflow.parse(text).steps[0].access == "all"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("I think worker 0 should answer.", "missing list: model_id"),
        ('model_id = [0]\nsubtasks = ["a"]', "missing list: access_list"),
        ('model_id = [0, 1]\nsubtasks = ["a"]\naccess_list = ["all"]', "unequal lengths"),
        ('model_id = ["gpt"]\nsubtasks = ["a"]\naccess_list = ["all"]', "model_id[0] is not a worker index"),
        ('model_id = [0]\nsubtasks = ["a"]\naccess_list = ["some"]', "access_list[0]"),
        ('model_id = 0\nsubtasks = ["a"]\naccess_list = ["all"]', "missing list: model_id"),
        ('model_id = [0, 1\nsubtasks = ["a"]\naccess_list = ["all"]', "missing list"),  # unterminated
    ],
)
def test_format_errors_name_the_problem(text, problem):
    with pytest.raises(WorkflowError) as caught:
        Workflow.parse(text)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_every_missing_list_is_reported_at_once():
    with pytest.raises(WorkflowError) as caught:
        Workflow.parse("nothing here")
    assert len(caught.value.problems) == 3


def _workflow(*steps):
    return Workflow(tuple(steps))


@pytest.mark.parametrize(
    "workflow, limits, problem",
    [
        (_workflow(Step(9, "x")), Limits(), "unknown worker 9 (the pool has workers 0..2)"),
        (_workflow(Step(-1, "x")), Limits(), "unknown worker -1"),
        (_workflow(Step(0, "x", (1,)), Step(1, "y")), Limits(), "refers to a later step (1)"),
        (_workflow(Step(0, "x"), Step(1, "y", (1,))), Limits(), "refers to itself (1)"),
        (_workflow(*[Step(0, "x")] * 6), Limits(max_steps=5), "too many steps: 6 > max_steps=5"),
        (_workflow(Step(0, "  ")), Limits(), "empty subtask"),
        (_workflow(), Limits(), "no steps"),
    ],
)
def test_validation_errors_are_precise(workflow, limits, problem):
    with pytest.raises(WorkflowError) as caught:
        workflow.validate(3, limits)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_empty_workflow_allowed_when_limits_say_so():
    assert _workflow().validate(3, Limits(allow_empty=True)) == _workflow()


def test_unknown_role_is_rejected_and_known_role_accepted():
    workflow = _workflow(Step(0, "x", role="critic"))
    with pytest.raises(WorkflowError, match="unknown role 'critic'"):
        workflow.validate(1, roles={"solve"})
    assert workflow.validate(1, roles={"solve", "critic"}) is workflow


def test_validation_collects_every_problem():
    workflow = _workflow(Step(7, ""), Step(0, "y", (5,)))
    assert len(workflow.problems(2)) == 3


def test_visible_steps():
    workflow = _workflow(Step(0, "a"), Step(0, "b", ()), Step(0, "c"), Step(0, "d", (0, 2)))
    assert [workflow.visible(i) for i in range(4)] == [(), (), (0, 1), (0, 2)]


# ---- round trip -------------------------------------------------------------------------------------------------
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


@st.composite
def workflows(draw):
    n = draw(st.integers(0, 6))
    steps = []
    for i in range(n):
        access = draw(st.one_of(st.just("all"), st.lists(st.integers(0, max(i - 1, 0)), max_size=3).map(tuple)))
        steps.append(Step(draw(st.integers(0, 20)), draw(_text), access, draw(st.none())))
    with_roles = draw(st.booleans())
    if with_roles and steps:
        roles = draw(st.lists(st.sampled_from(["solve", "plan", "verify"]), min_size=n, max_size=n))
        steps = [Step(s.worker, s.subtask, s.access, r) for s, r in zip(steps, roles, strict=True)]
    return Workflow(tuple(steps), draw(_text).strip())


@given(workflows())
def test_to_text_round_trips(workflow):
    assert Workflow.parse(workflow.to_text()) == workflow


def test_mermaid_shows_steps_edges_and_escapes_quotes():
    workflow = Workflow.parse(PAPER_STYLE)
    chart = workflow.to_mermaid(worker_names=["smollm2", "gemma", "python"])
    assert chart.startswith("flowchart TD")
    assert "S0 --> S2" in chart and "S1 --> S2" in chart and "S0 --> S1" in chart
    assert "2 · Model 1 (gemma)" in chart
    assert '"step' not in chart.split("S1[", 1)[1].split("\n")[0][1:-2]  # inner quotes escaped
    assert "S2 --> A" in chart


NAMES = ("gemma", "check", "smollm2")


@pytest.mark.parametrize(
    ("written", "worker"),
    [('"check"', 1), ('"CHECK"', 1), ('" smollm2 "', 2), ("2", 2), ('"Model 0"', 0)],
)
def test_with_names_a_worker_may_be_named_as_well_as_numbered(written, worker):
    text = f'model_id = [{written}]\nsubtasks = ["a"]\naccess_list = [[]]'
    assert Workflow.parse(text, NAMES).steps[0].worker == worker


def test_a_name_that_is_no_worker_is_a_problem_listing_the_names():
    with pytest.raises(WorkflowError, match="one of the names gemma, check, smollm2: 'python'"):
        Workflow.parse('model_id = ["python"]\nsubtasks = ["a"]\naccess_list = [[]]', NAMES)
    with pytest.raises(WorkflowError, match="not a worker index: 'check'"):
        Workflow.parse('model_id = ["check"]\nsubtasks = ["a"]\naccess_list = [[]]')  # names only when given


@given(st.lists(st.integers(0, len(NAMES) - 1), min_size=1, max_size=4))
def test_text_by_name_reads_back_to_the_same_workflow(workers):
    workflow = Workflow(tuple(Step(w, f"do {i}", "all" if i else ()) for i, w in enumerate(workers)))
    text = workflow.to_text(NAMES)
    assert text.startswith("model_id = [" + ", ".join(f'"{NAMES[w]}"' for w in workers) + "]")
    assert Workflow.parse(text, NAMES) == workflow
