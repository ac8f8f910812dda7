"""The supervised warm start: exact prompts, completion-only loss, overfitting, determinism, clear errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402
import pydantic  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conductor.conductor_lm import ConductorLM, Sample  # noqa: E402
from conductor.errors import ConductorError, ConfigError  # noqa: E402
from conductor.modules import Conductor, RunError, Step, StepTrace, WorkerPool, Workflow  # noqa: E402
from conductor.modules.workflow import workflow_fields  # noqa: E402
from conductor.optimizers._checkpoint import checkpoints  # noqa: E402
from conductor.optimizers._optim import optimizer_step  # noqa: E402
from conductor.optimizers.finetune import (  # noqa: E402
    TemplateStep,
    TemplateWarmStartConfig,
    WarmStartConfig,
    _finetune,
    completion_nll,
    from_predictions,
    synthetic_workflows,
    templated_workflows,
    training_pairs,
    warm_start,
)
from conductor.testing import ScriptedWorker  # noqa: E402

SHORT = "Write a workflow."
ADD = Workflow.from_lists([1], ["Add the numbers."], [[]])
LOOKUP = Workflow.from_lists([0, 1], ["Look it up.", "Give the final answer."], [[], "all"], reasoning="Two steps.")
EXAMPLES = [({"question": "2+2?"}, ADD), ({"question": "Capital of France?"}, LOOKUP)]


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs with one torch thread (see tests/conftest.py)."""


def program(lm: dspy.LM | None = None, workers: int = 2) -> Conductor:
    """A conductor over scripted workers, with short instructions so the byte-level tiny model trains fast (and so
    the tests also show that the predictor's own instructions are the ones trained on)."""
    conductor = Conductor(WorkerPool([ScriptedWorker(f"w{i}", lambda _: "Answer: 4") for i in range(workers)]), lm)
    conductor.orchestrate.signature = conductor.orchestrate.signature.with_instructions(SHORT)
    return conductor


def tiny(**kwargs) -> ConductorLM:
    """The tiny policy, its LoRA adapters included, the same every time (``tiny(seed)`` seeds only the base)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConductorLM.tiny(seed=0, **kwargs)


def mean_loss(policy: ConductorLM, pairs: list) -> float:
    return completion_nll(policy, pairs).item() / sum(len(c) for _, c in pairs)


def test_the_training_prompt_is_exactly_what_the_conductor_sends_at_inference() -> None:
    policy = tiny()
    seen: list[Sample] = []
    conductor = program(policy.as_dspy_lm(max_tokens=4, on_sample=seen.append))
    demo = {"question": "3+3?", "workers": "Model 0\nModel 1", "available_roles": "solve", "max_steps": 5}
    conductor.orchestrate.demos = [dspy.Example(**demo, **workflow_fields(LOOKUP))]
    conductor(question="Capital of France?")
    ((prompt, completion),) = training_pairs(policy, conductor, [EXAMPLES[1]], max_length=4096)
    assert prompt == list(seen[0].prompt_ids)
    text = policy.decode(prompt)
    assert SHORT in text and "3+3?" in text and LOOKUP.to_text() in text  # instructions and demo as rendered
    assert completion[-1] in policy.eos_ids and policy.decode(completion) == LOOKUP.to_text()


def test_overfitting_a_few_workflows_makes_the_conductor_write_them() -> None:
    # A full fine-tune: the tiny model's random, frozen tied embeddings cap its logits, so LoRA alone can't get sharp.
    policy = tiny(lora=None)
    conductor = program(policy.as_dspy_lm(max_tokens=160))
    pairs = training_pairs(policy, conductor, EXAMPLES, max_length=4096)
    before = mean_loss(policy, pairs)
    report = warm_start(policy, conductor, EXAMPLES, WarmStartConfig(steps=100, batch_size=2, lr=1e-2))
    assert report.steps == 100 and report.examples == 2 and report.seconds > 0
    assert report.trained_examples == 200 and report.epochs == 100  # each step trains on both
    assert report.completion_tokens == 100 * sum(len(c) for _, c in pairs)
    assert report.losses[0] == pytest.approx(before, rel=1e-5)
    assert mean_loss(policy, pairs) < 0.05 < 2.0 < before
    assert not policy.model.training  # the mode it was in is restored
    for inputs, workflow in EXAMPLES:
        prediction = conductor(**inputs)
        assert prediction.error is None
        assert prediction.conductor_text == workflow.to_text() and prediction.workflow == workflow


def test_the_loss_ignores_what_the_model_predicts_for_prompt_tokens() -> None:
    policy = tiny()
    pairs = training_pairs(policy, program(), EXAMPLES, max_length=4096)
    # for each pair: the same as cross-entropy with the prompt's labels masked out (-100), unlike with them kept
    for prompt, completion in pairs:
        ids = torch.tensor([prompt + completion])
        logits = policy.model(input_ids=ids).logits[0, :-1]
        labels = ids[0, 1:].clone()
        masked = F.cross_entropy(logits, labels.masked_fill(torch.arange(len(labels)) < len(prompt) - 1, -100))
        together = completion_nll(policy, pairs).item()  # pairs scored in one call, as training does
        alone = completion_nll(policy, [(prompt, completion)]).item()
        assert alone / len(completion) == pytest.approx(masked.item(), abs=1e-4)
        assert F.cross_entropy(logits, labels).item() != pytest.approx(masked.item(), abs=1e-2)
    assert together == pytest.approx(sum(completion_nll(policy, [pair]).item() for pair in pairs), abs=1e-3)


def test_the_same_seed_gives_the_same_run_and_only_the_adapters_change() -> None:
    examples = synthetic_workflows(2, ["1+1?", "2+5?", "Who wrote Hamlet?", "Boiling point of water?", "7*6?"], seed=0)
    config = WarmStartConfig(steps=4, batch_size=4, grad_accumulation=2, lr=1e-2, seed=3)

    def run(config: WarmStartConfig) -> tuple[ConductorLM, tuple[float, ...]]:
        policy = tiny()
        return policy, warm_start(policy, program(), examples, config).losses

    first, losses = run(config)
    second, again = run(config)
    assert losses == again
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    _, reshuffled = run(config.model_copy(update={"seed": 4}))
    assert reshuffled != losses
    untouched = tiny()
    pairs = training_pairs(untouched, program(), examples, max_length=4096)
    assert mean_loss(first, pairs) < mean_loss(untouched, pairs)  # LoRA alone lowers the loss too
    trained = {n for n, p in first.model.named_parameters() if p.requires_grad}
    for (name, a), b in zip(first.model.named_parameters(), untouched.model.parameters(), strict=True):
        assert torch.equal(a, b) == (name not in trained), name


def test_gradient_accumulation_saves_memory_without_changing_the_update() -> None:
    examples = synthetic_workflows(2, ["1+1?", "2+5?", "Who wrote Hamlet?", "7*6?", "Capital of Peru?"], seed=1)

    def run(accumulation: int) -> tuple[float, ...]:
        config = WarmStartConfig(steps=3, batch_size=4, grad_accumulation=accumulation, lr=1e-2)
        return warm_start(tiny(), program(), examples, config).losses

    assert run(2) == pytest.approx(run(1), abs=1e-5)


RESUMABLE = WarmStartConfig(steps=6, batch_size=2, lr=1e-2, seed=3, checkpoint_every=2)
QUESTIONS = ["1+1?", "2+5?", "Who wrote Hamlet?", "7*6?", "Capital of Peru?"]


class Killed(Exception):
    """A process killed mid-run (an exception here, so that a failing test does not stop the whole session)."""


def updates(monkeypatch: pytest.MonkeyPatch, die_at: int | None = None) -> list[int]:
    """The warm start's optimizer updates from now on, counted from 1; it dies as it is about to make the
    ``die_at``-th, as a ``kill -9`` would leave it."""
    made: list[int] = []

    def update(*args) -> None:
        if len(made) + 1 == die_at:
            raise Killed
        optimizer_step(*args)
        made.append(len(made) + 1)

    monkeypatch.setattr(_finetune, "optimizer_step", update)
    return made


def test_a_killed_warm_start_goes_on_from_its_checkpoint_to_the_weights_of_an_unbroken_run(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    examples = synthetic_workflows(2, QUESTIONS, seed=0)
    unbroken = tiny()
    straight = warm_start(unbroken, program(), examples, RESUMABLE)

    with monkeypatch.context() as patch:
        updates(patch, die_at=5)
        with pytest.raises(Killed):
            warm_start(tiny(), program(), examples, RESUMABLE, checkpoint_dir=tmp_path)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000004"]  # step 5 was lost

    resumed = tiny()  # a fresh process's policy: the checkpoint brings the trained weights back
    made = updates(monkeypatch)
    report = warm_start(resumed, program(), examples, RESUMABLE, checkpoint_dir=tmp_path, progress=True)
    assert len(made) == 2  # steps 5 and 6
    bar = capsys.readouterr().err
    assert "warm start" in bar and "4/6" in bar and "6/6" in bar  # the bar goes on from step 4
    assert report.losses == straight.losses and report.learning_rates == straight.learning_rates
    assert (report.trained_examples, report.completion_tokens) == (
        straight.trained_examples,
        straight.completion_tokens,
    )
    assert all(torch.equal(a, b) for a, b in zip(unbroken.trainable_state(), resumed.trainable_state(), strict=True))
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000006"]  # the last step's, for a compile killed later


def test_a_finished_warm_start_found_again_restores_its_weights_without_training(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = synthetic_workflows(2, QUESTIONS, seed=0)
    trained = tiny()
    first = warm_start(trained, program(), examples, RESUMABLE, checkpoint_dir=tmp_path)
    updates(monkeypatch, die_at=1)  # any update would fail
    again = tiny()
    report = warm_start(again, program(), examples, RESUMABLE, checkpoint_dir=tmp_path)
    assert report.losses == first.losses and report.seconds == first.seconds
    assert all(torch.equal(a, b) for a, b in zip(trained.trainable_state(), again.trainable_state(), strict=True))


def test_a_checkpoint_of_another_config_or_other_examples_is_refused_before_anything_is_loaded(tmp_path) -> None:
    examples = synthetic_workflows(2, QUESTIONS, seed=0)
    warm_start(tiny(), program(), examples, RESUMABLE, checkpoint_dir=tmp_path)
    policy = tiny()
    before = policy.trainable_state()
    with pytest.raises(ConductorError, match=rf"other warm_start: delete {tmp_path / 'checkpoints'}"):
        warm_start(policy, program(), examples, RESUMABLE.model_copy(update={"lr": 2e-2}), checkpoint_dir=tmp_path)
    with pytest.raises(ConductorError, match="other examples"):
        warm_start(policy, program(), examples[:-1], RESUMABLE, checkpoint_dir=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.trainable_state(), strict=True))
    assert not policy.model.training
    # how often it checkpoints is not part of the run: changing it goes on from the same checkpoint
    warm_start(
        policy, program(), examples, RESUMABLE.model_copy(update={"checkpoint_every": 3}), checkpoint_dir=tmp_path
    )


def test_schedule_warms_up_then_decays() -> None:
    config = WarmStartConfig(epochs=5, batch_size=1, lr=1e-2, warmup_ratio=0.2)
    report = warm_start(tiny(), program(), EXAMPLES, config)
    assert report.steps == 10
    assert report.learning_rates[:2] == pytest.approx([1e-2 / 3, 2e-2 / 3])  # never 0: the first step learns too
    assert max(report.learning_rates) == pytest.approx(1e-2)
    assert report.learning_rates.index(max(report.learning_rates)) == 2
    assert list(report.learning_rates[2:]) == sorted(report.learning_rates[2:], reverse=True)


def test_no_examples_is_a_clear_error() -> None:
    with pytest.raises(ConductorError, match="at least one"):
        warm_start(tiny(), program(), [])


def test_every_unusable_example_is_listed() -> None:
    bad = [
        EXAMPLES[0],
        ({"question": "q"}, Workflow.from_lists([5], ["do it"], [[]])),
        ({"question": "q"}, Workflow(tuple(Step(0, "x") for _ in range(6)))),
        ({"prompt": "q"}, ADD),
        ("q", "model_id = [0]"),
    ]
    with pytest.raises(ConductorError) as caught:
        warm_start(tiny(), program(), bad)
    message = str(caught.value)
    assert "example 0" not in message
    assert "example 1: step 0: unknown worker 5 (the pool has workers 0..1)" in message
    assert "example 2: too many steps: 6 > max_steps=5" in message
    assert "example 3: missing input field(s): ['question']" in message
    assert "example 4: not an (inputs, Workflow[, WorkerPool]) tuple" in message
    with pytest.raises(ConductorError, match=r"example 1: \d+ tokens .* exceed max_length=50"):
        training_pairs(tiny(), program(), [({"question": "q" * 50}, ADD)] * 2, max_length=50)


def test_synthetic_workflows_are_valid_varied_and_reproducible() -> None:
    questions = [f"What is {i} + {2 * i}?" for i in range(60)] + ["x" * 500, {"question": "Who wrote Hamlet?"}]
    pairs = synthetic_workflows(3, questions, max_steps=4, seed=7)
    assert pairs == synthetic_workflows(3, questions, max_steps=4, seed=7)
    assert pairs != synthetic_workflows(3, questions, max_steps=4, seed=8)
    assert [inputs for inputs, _ in pairs] == [{"question": q} for q in questions[:-1]] + [questions[-1]]
    workflows = [w for _, w in pairs]
    for inputs, workflow in pairs:
        assert workflow.problems(3) == [] and Workflow.parse(workflow.to_text()) == workflow
        assert "final answer" in workflow.steps[-1].subtask and workflow.reasoning
        assert any(inputs["question"] in s.subtask for s in workflow.steps) or len(inputs["question"]) > 160
    assert {len(w) for w in workflows} == {1, 2, 3, 4}
    assert {s.worker for w in workflows for s in w.steps} == {0, 1, 2}
    assert {s.access for w in workflows for s in w.steps[1:]} == {"all", ()}
    assert "x" * 500 not in workflows[-2].to_text()  # a long question is referred to, not copied
    with pytest.raises(ConfigError):
        synthetic_workflows(0, questions)


def test_predictions_that_scored_well_become_training_pairs() -> None:
    example = dspy.Example(question="2+2?", answer="4").with_inputs("question")
    fallback = Workflow((Step(0, "Answer the overall task directly and completely.", ()),))
    guess = Workflow.from_lists([0], ["Guess."], [[]])

    def prediction(answer: str, workflow: Workflow, error: RunError | None = None) -> dspy.Prediction:
        trace = [StepTrace(i, 0, "w", "solve", "s", ()) for i in range(len(workflow))]
        return dspy.Prediction(answer=answer, workflow=workflow, error=error, trace=trace, tokens=10, cost=0.0)

    predictions = [
        prediction("4", ADD),
        prediction("5", guess),  # wrong: reward 0.5
        prediction("4", fallback, RunError("format", "missing list: model_id")),  # right, but by the fallback
        prediction("4", ADD),  # the same pair again
        prediction("4", LOOKUP),
    ]

    def exact(example, prediction, trace=None):
        return example.answer == prediction.answer

    pairs = from_predictions([example] * 5, predictions, exact)
    assert pairs == [({"question": "2+2?"}, ADD), ({"question": "2+2?"}, LOOKUP)]
    assert [w for _, w in from_predictions([example] * 5, predictions, exact, min_reward=0.5)] == [ADD, guess, LOOKUP]
    with pytest.raises(ConductorError, match="2 examples but 5 predictions"):
        from_predictions([example] * 2, predictions, exact)
    with pytest.raises(ConductorError, match="with_inputs"):
        from_predictions([dspy.Example(question="2+2?", answer="4")], predictions[:1], exact)


# ---- templated workflows over random pools -------------------------------------------------------------------------
def families(n: int = 3) -> list[dspy.Example]:
    return [
        dspy.Example(question=f"{family} {i}?", answer="4", family=family).with_inputs("question")
        for family in ("sum", "lookup", "other")
        for i in range(n)
    ]


TEMPLATES = {
    "sum": (TemplateStep(worker="w1", subtask="Solve.", access=()), TemplateStep(worker="w3", subtask="Check.")),
    "lookup": (TemplateStep(worker="w0", subtask="Answer", access=()),),
}


def test_templates_become_workflows_on_their_workers_places_in_random_pools() -> None:
    conductor = program(workers=4)
    examples = templated_workflows(
        conductor.pool, families(), TEMPLATES, label="family", pools_per_question=5, min_pool_size=2, seed=1
    )
    assert len(examples) == 2 * 3 * 5  # "other" has no template: left out
    orders = set()
    for inputs, workflow, pool in examples:
        family = inputs["question"].split()[0]
        expected = tuple((step.worker, step.access) for step in TEMPLATES[family])
        assert workflow.shape(pool.names) == expected  # the template's workers, wherever the pool put them
        assert len(pool) >= 2 and set(pool.names) <= {"w0", "w1", "w2", "w3"}
        orders.add(tuple(pool.names))
    assert len(orders) > 5  # many subsets and orders, so places carry no meaning
    again = templated_workflows(
        conductor.pool, families(), TEMPLATES, label="family", pools_per_question=5, min_pool_size=2, seed=1
    )
    assert [(w, p.names) for _, w, p in again] == [(w, p.names) for _, w, p in examples]


def test_a_pool_without_the_first_templates_workers_is_taught_the_next_that_fits() -> None:
    conductor = program(workers=4)
    preferred = (TemplateStep(worker="w0", subtask="Answer", access=()),)
    fallback = (TemplateStep(worker="w1", subtask="Answer yes or no.", access=()),)
    templates = {"lookup": [preferred, fallback]}
    examples = templated_workflows(
        conductor.pool, families(), templates, label="family", pools_per_question=40, min_pool_size=1, seed=2
    )
    assert len(examples) == 3 * 40
    taught = {"preferred": 0, "fallback": 0}
    for _, workflow, pool in examples:
        if "w0" in pool.names:
            assert workflow.shape(pool.names) == (("w0", ()),)
            taught["preferred"] += 1
        else:  # the first template can't run here: the next one whose workers the pool holds
            assert "w1" in pool.names and workflow.shape(pool.names) == (("w1", ()),)
            assert workflow.steps[0].subtask == "Answer yes or no."
            taught["fallback"] += 1
    assert min(taught.values()) > 10  # both are taught; pools that fit neither were drawn again
    # one template is the same as a list holding it
    single = templated_workflows(conductor.pool, families(), {"lookup": preferred}, label="family", seed=2)
    listed = templated_workflows(conductor.pool, families(), {"lookup": [preferred]}, label="family", seed=2)
    assert [(w, p.names) for _, w, p in single] == [(w, p.names) for _, w, p in listed]


def test_the_template_config_takes_one_template_or_a_preference_list() -> None:
    step = {"worker": "w0", "subtask": "Answer", "access": []}
    config = TemplateWarmStartConfig(templates={"one": [step], "two": [[step], [{**step, "worker": "w1"}]]})
    assert [len(config.templates[key]) for key in ("one", "two")] == [1, 2]
    assert config.templates["two"][1][0].worker == "w1"
    with pytest.raises(pydantic.ValidationError, match="subtask"):
        TemplateWarmStartConfig(templates={"two": [[step], [{"worker": "w1"}]]})
    with pytest.raises(ConfigError, match="template 'two' has no steps"):
        templated_workflows(program().pool, families(), {"two": [[step], []]}, label="family")


def test_a_template_naming_an_unknown_worker_is_a_clear_error() -> None:
    bad = {"sum": (TemplateStep(worker="gpt", subtask="Solve."),), "lookup": ()}
    with pytest.raises(ConfigError, match="no worker named 'gpt'") as error:
        templated_workflows(program().pool, families(), bad, label="family")
    assert "template 'lookup' has no steps" in str(error.value)


def test_an_example_with_its_own_pool_is_trained_on_the_prompt_of_that_pool() -> None:
    policy, conductor = tiny(), program(workers=3)
    pool = conductor.pool.subset([2, 0])
    ((prompt, _),) = training_pairs(policy, conductor, [({"question": "2+2?"}, ADD, pool)], max_length=4096)
    seen = conductor.copy_with(pool=pool)
    assert prompt == policy.encode(seen.prompt_messages("2+2?")) != policy.encode(conductor.prompt_messages("2+2?"))
    with pytest.raises(ConductorError, match=r"example 0: .*step 0.*worker 1"):
        training_pairs(policy, conductor, [({"question": "2+2?"}, ADD, conductor.pool.subset([2]))], 4096)


def test_a_conductor_that_names_workers_is_trained_on_workflows_by_name() -> None:
    policy, conductor = tiny(), program(workers=3)
    conductor.worker_ids = "names"
    ((_, completion),) = training_pairs(policy, conductor, [({"question": "2+2?"}, ADD)], max_length=4096)
    assert policy.decode(completion).startswith('model_id = ["w1"]')
    swapped = conductor.pool.subset([1, 0])  # ADD's worker 1 is w0 in this example's own pool
    ((_, completion),) = training_pairs(policy, conductor, [({"question": "2+2?"}, ADD, swapped)], max_length=4096)
    assert policy.decode(completion).startswith('model_id = ["w0"]')
