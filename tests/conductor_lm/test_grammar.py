"""The workflow grammar accepts exactly the canonical text of valid workflows, and constrained sampling only ever
writes runnable workflows (the tiny policy here, the real SmolLM2 in the slow test)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList

from conductor.conductor_lm import ConductorLM, byte_tokenizer
from conductor.conductor_lm._grammar import WorkflowConstraint, WorkflowFormat, workflow_grammar
from conductor.errors import ConfigError, MissingDependency
from conductor.modules.workflow import Limits, Step, Workflow

needs_xgrammar = pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="needs xgrammar")

ROLES = ("plan", "solve", "check")
NAMES = ("gemma", 'say "hi"', "rédacteur")
FORMATS = {
    "binary": WorkflowFormat(3, 3, max_subtask_bytes=40),
    "rich": WorkflowFormat(4, 5, roles=ROLES, access="indices", reasoning=True, max_subtask_bytes=40),
    "recursive": WorkflowFormat(3, 3, max_subtask_bytes=40, conductor_step=True, allow_empty=True),
    "recursive rich": WorkflowFormat(
        4, 3, roles=ROLES, access="indices", reasoning=True, max_subtask_bytes=40, conductor_step=True, allow_empty=True
    ),
    "named": WorkflowFormat(3, 3, max_subtask_bytes=40, worker_names=NAMES),
    "named recursive": WorkflowFormat(
        3, 3, access="indices", max_subtask_bytes=40, worker_names=NAMES, conductor_step=True, allow_empty=True
    ),
}


@pytest.fixture(scope="module")
def constraints() -> dict[str, WorkflowConstraint]:
    if importlib.util.find_spec("xgrammar") is None:
        pytest.skip("needs xgrammar")
    tokenizer = byte_tokenizer()
    return {name: WorkflowConstraint(tokenizer, fmt) for name, fmt in FORMATS.items()}


def written_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False)[1:-1].encode())


def texts(max_bytes: int) -> st.SearchStrategy[str]:
    """One-line strings that start with a non-blank character and fit ``max_bytes`` as written."""
    chars = st.characters(blacklist_categories=("Cc", "Cs"))
    return st.text(chars, min_size=1, max_size=max_bytes).filter(
        lambda s: not s[0].isspace() and written_bytes(s) <= max_bytes
    )


@st.composite
def workflows(draw: st.DrawFn, fmt: WorkflowFormat) -> Workflow:
    steps = []
    n = draw(st.integers(0 if fmt.allow_empty else 1, fmt.max_steps))
    for i in range(n):
        access = st.just("all") | st.just(())
        if fmt.access == "indices":
            access |= st.sets(st.integers(0, i - 1), max_size=i).map(lambda s: tuple(sorted(s))) if i else st.just(())
        role = st.sampled_from(fmt.roles) if fmt.roles else st.none()
        last = fmt.n_workers if fmt.conductor_step and i == n - 1 > 0 else fmt.n_workers - 1  # the conductor's id
        steps.append(Step(draw(st.integers(0, last)), draw(texts(fmt.max_subtask_bytes)), draw(access), draw(role)))
    reasoning = draw(texts(fmt.max_reasoning_bytes)) if fmt.reasoning else ""
    return Workflow(tuple(steps), reasoning)


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_grammar_accepts_every_valid_workflow_in_canonical_form(
    constraints: dict[str, WorkflowConstraint], name: str, data: st.DataObject
) -> None:
    fmt = FORMATS[name]
    workflow = data.draw(workflows(fmt))
    n_workers = fmt.n_workers + fmt.conductor_step
    workflow.validate(n_workers, Limits(max_steps=fmt.max_steps, allow_empty=fmt.allow_empty), set(ROLES))
    assert constraints[name].accepts(workflow.to_text(fmt.names()))


def test_a_workflow_with_quotes_backslashes_and_non_ascii_is_accepted(
    constraints: dict[str, WorkflowConstraint],
) -> None:
    steps = (Step(0, 'Plan "this" \\ now: é, ∑, 😀', (), "plan"), Step(3, "Solve", (0,), "solve"))
    assert constraints["rich"].accepts(Workflow(steps, "Two steps.").to_text())


BINARY = 'model_id = [0, 2]\nsubtasks = ["Plan it", "Do it"]\naccess_list = [[], "all"]'
RICH = (
    'reasoning = "Plan, then do."\nmodel_id = [0, 2, 1]\nsubtasks = ["Plan it", "Do it", "Check it"]\n'
    'access_list = [[], [0], [0, 1]]\nroles = ["plan", "solve", "check"]'
)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("binary", BINARY.replace("[0, 2]", "[0]")),  # unequal lengths
        ("binary", BINARY.replace('"Do it"]', '"Do it", "More"]')),
        ("binary", BINARY.replace("[0, 2]", "[0, 3]")),  # worker out of range
        ("binary", BINARY.replace("[0, 2]", "[0, -1]")),
        ("binary", BINARY.replace('[[], "all"]', "[[], [0]]")),  # index lists need access="indices"
        ("binary", BINARY.replace('"Plan it"', '""')),  # empty subtask
        ("binary", BINARY.replace('"Plan it"', '" Plan it"')),  # blank start
        ("binary", BINARY.replace('"Plan it"', '"Plan\\nit"')),  # a subtask is one line
        ("binary", BINARY.replace('"Plan it"', json.dumps("x" * 41))),  # over max_subtask_bytes
        ("binary", BINARY.replace('"Plan it"', json.dumps("é" * 21, ensure_ascii=False))),  # 42 bytes
        ("binary", BINARY.replace("[0, 2]", "[0, 2, 1, 0]").replace('"Do it"', '"Do it", "a", "b"')),  # > max_steps
        ("binary", BINARY.replace('"all"', "'all'")),
        ("binary", BINARY + "\n"),  # nothing after the last list
        ("binary", BINARY.replace("model_id = [0, 2]", "model_id: [0, 2]")),
        ("binary", 'reasoning = "Hm."\n' + BINARY),  # reasoning only with reasoning=True
        ("rich", RICH.replace("[0, 1]]", "[2]]")),  # refers to itself
        ("rich", RICH.replace("[[], [0]", "[[], [1]")),  # refers to a later step
        ("rich", RICH.replace("[[], [0]", "[[0], [0]")),  # step 0 sees nothing
        ("rich", RICH.replace("[0, 1]]", "[1, 0]]")),  # indices increase
        ("rich", RICH.replace("[0, 1]]", "[0, 0]]")),
        ("rich", RICH.replace('"check"]', '"verify"]')),  # unknown role
        ("rich", RICH.replace('"check"]', '"Check"]')),
        ("rich", RICH.replace('"solve", "check"]', '"solve"]')),
        ("rich", RICH.rsplit("\n", 1)[0]),  # roles are required when given
        ("rich", RICH.split("\n", 1)[1]),  # reasoning is required with reasoning=True
    ],
)
def test_the_grammar_rejects_invalid_workflows(
    constraints: dict[str, WorkflowConstraint], name: str, text: str
) -> None:
    assert constraints[name].accepts(BINARY if name == "binary" else RICH)
    assert not constraints[name].accepts(text)


EMPTY = "model_id = []\nsubtasks = []\naccess_list = []"
CALLS_ITSELF = BINARY.replace("[0, 2]", "[0, 3]")
"""Model 3 is the conductor of a three-worker pool."""


@pytest.mark.parametrize(
    ("name", "text", "accepted"),
    [
        ("recursive", EMPTY, True),
        ("recursive", CALLS_ITSELF, True),
        ("recursive", 'model_id = [0, 1, 3]\nsubtasks = ["a", "b", "c"]\naccess_list = [[], "all", "all"]', True),
        ("binary", EMPTY, False),  # only with allow_empty
        ("binary", CALLS_ITSELF, False),  # only with conductor_step
        ("recursive", CALLS_ITSELF.replace("[0, 3]", "[3, 0]"), False),  # only the last step
        ("recursive", 'model_id = [3]\nsubtasks = ["Go"]\naccess_list = [[]]', False),  # after another step
        ("recursive", CALLS_ITSELF.replace("[0, 3]", "[0, 4]"), False),
        ("recursive", EMPTY.replace("[]", "[ ]", 1), False),
        ("recursive rich", 'reasoning = "Keep it."\n' + EMPTY, True),
        ("recursive rich", EMPTY, False),  # reasoning is still required
        ("recursive rich", 'reasoning = "Keep it."\n' + EMPTY + "\nroles = []", False),  # as to_text: no roles line
    ],
)
def test_the_recursive_grammar_has_the_conductors_id_last_and_the_empty_lists(
    constraints: dict[str, WorkflowConstraint], name: str, text: str, accepted: bool
) -> None:
    assert constraints[name].accepts(text) is accepted


NAMED = 'model_id = ["gemma", "say \\"hi\\""]\nsubtasks = ["Plan it", "Do it"]\naccess_list = [[], "all"]'


@pytest.mark.parametrize(
    ("name", "text", "accepted"),
    [
        ("named", NAMED, True),
        ("named", NAMED.replace('"gemma"', '"rédacteur"'), True),
        ("named", BINARY, False),  # numbers are not names
        ("named", NAMED.replace('"gemma"', '"Gemma"'), False),  # the name as the pool writes it
        ("named", NAMED.replace('"gemma"', '"python"'), False),  # not in the pool
        ("named", NAMED.replace('"gemma"', '"conductor"'), False),  # only with conductor_step
        ("named recursive", NAMED.replace('"gemma", "say \\"hi\\""', '"conductor", "gemma"'), False),  # last only
        ("named recursive", NAMED.replace('"say \\"hi\\""', '"conductor"'), True),
        ("named recursive", EMPTY, True),
    ],
)
def test_the_named_grammar_writes_workers_by_their_pool_names(
    constraints: dict[str, WorkflowConstraint], name: str, text: str, accepted: bool
) -> None:
    assert constraints[name].accepts(text) is accepted


def test_every_order_of_a_pool_shares_one_named_grammar() -> None:
    grammars = {
        WorkflowFormat(3, 2, worker_names=order).grammar() for order in (NAMES, NAMES[::-1], NAMES[1:] + NAMES[:1])
    }
    assert len(grammars) == 1  # compiled once for GRPO's random orders: the names, not their places, are the text


@pytest.mark.parametrize("name", FORMATS)
def test_the_longest_workflow_is_accepted_and_bounds_the_tokens(
    constraints: dict[str, WorkflowConstraint], name: str
) -> None:
    fmt = FORMATS[name]
    text = fmt.longest().to_text(fmt.names())
    assert constraints[name].accepts(text)
    assert not constraints[name].accepts(text.replace('"]\naccess_list', 'x"]\naccess_list'))
    assert fmt.max_tokens() == len(text.encode()) + 1


def test_fit_chooses_the_subtask_bound_from_a_token_budget() -> None:
    fmt = WorkflowFormat(3, 3).fit(120)
    assert fmt.max_tokens() <= 120 < WorkflowFormat(3, 3, max_subtask_bytes=fmt.max_subtask_bytes + 1).max_tokens()
    with pytest.raises(ConfigError, match="too small"):
        WorkflowFormat(3, 3).fit(60)


def test_bad_formats_name_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        WorkflowFormat(0, 0, roles=("Plan", "plan", "plan"), access="all")  # type: ignore[arg-type]
    message = str(info.value)
    for part in ("n_workers", "max_steps", "access", "distinct", "'Plan'"):
        assert part in message
    with pytest.raises(ConfigError, match="worker_names must name each of the 3 workers"):
        WorkflowFormat(3, 2, worker_names=("a", "b"))
    assert workflow_grammar(2, 2, roles=["plan"]) == WorkflowFormat(2, 2, roles=("plan",)).grammar()


def test_the_processor_keeps_one_matcher_per_row_and_restarts_for_a_new_generation(
    constraints: dict[str, WorkflowConstraint],
) -> None:
    tokenizer, constraint = byte_tokenizer(), constraints["binary"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    short = BINARY.replace("Plan it", "P")
    targets = [tokenizer(text, add_special_tokens=False)["input_ids"] + [eos] for text in (BINARY, short)]
    input_ids = torch.tensor([[pad, 10, 11], [12, 13, 14]])  # left-padded prompts
    for step in range(len(targets[0])):
        scores = torch.zeros(2, constraint.vocab_size)
        constraint(input_ids, scores)
        allowed = [set(torch.isfinite(row).nonzero()[:, 0].tolist()) for row in scores]
        next_tokens = []
        for row, target in enumerate(targets):
            if step < len(target):
                assert target[step] in allowed[row]
                assert allowed[row] == {eos} if step == len(target) - 1 else eos not in allowed[row]
                next_tokens.append(target[step])
            else:  # the row has ended: generate pads it, and the constraint leaves it alone
                assert len(allowed[row]) == constraint.vocab_size
                next_tokens.append(pad)
        input_ids = torch.cat([input_ids, torch.tensor(next_tokens)[:, None]], dim=1)
    scores = torch.zeros(2, constraint.vocab_size)
    constraint(input_ids[:, :4], scores)  # not a continuation: fresh matchers
    assert torch.isfinite(scores).nonzero()[:, 1].tolist() == tokenizer("mm", add_special_tokens=False)["input_ids"]


def test_a_missing_xgrammar_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(MissingDependency, match="pip install xgrammar"):
        WorkflowConstraint(byte_tokenizer(), WorkflowFormat(2, 2))


@needs_xgrammar
def test_constrained_sampling_writes_only_runnable_workflows(tiny: ConductorLM) -> None:
    fmt = WorkflowFormat(3, 3, roles=ROLES, access="indices").fit(160)
    constraint = WorkflowConstraint(tiny.tokenizer, fmt, stop_token_ids=sorted(tiny.eos_ids))
    assert WorkflowConstraint(tiny.tokenizer, fmt).compiled is constraint.compiled  # compiled once
    prompts = [[{"role": "user", "content": q}] for q in ("What is 2 + 2?", "Name a prime.", "Sort [3, 1, 2].")]
    samples = []
    for seed in (0, 1):  # one constraint object serves several generate calls and uneven chunks
        rows = tiny.sample(
            prompts, 4, max_new_tokens=fmt.max_tokens(), seed=seed, logits_processor=constraint, batch_size=5
        )
        samples += [s for row in rows for s in row]
    assert len(samples) == 24
    for sample in samples:
        assert sample.finish_reason == "stop"
        Workflow.parse(sample.text).validate(3, Limits(max_steps=3), set(ROLES))
    assert len({s.text for s in samples}) == len(samples)


@needs_xgrammar
def test_constrain_program_gives_each_round_its_grammar(tiny: ConductorLM) -> None:
    from conductor.conductor_lm import constrain_program
    from conductor.modules import Conductor, WorkerPool
    from conductor.testing import ScriptedWorker

    pool = WorkerPool([ScriptedWorker("a", lambda p: "1"), ScriptedWorker("b", lambda p: "2")])
    seen: list[object] = []
    lm = tiny.as_dspy_lm(max_tokens=96, on_sample=seen.append)
    program = Conductor(pool, lm, max_steps=2)
    constrain_program(program)
    constrained = program.orchestrate.lm
    assert constrained.engine.logits_processor.format == WorkflowFormat(2, 2).fit(96)
    assert lm.engine.logits_processor is None  # the LM is built again with the grammar, not patched
    assert constrained.kwargs == lm.kwargs and constrained.engine.on_sample == seen.append
    with pytest.raises(ConfigError, match="only a local or trained conductor"):
        constrain_program(Conductor(pool, max_steps=2))

    recursive = Conductor(pool, tiny.as_dspy_lm(max_tokens=96, temperature=1.0), max_steps=2, max_depth=1)
    constrain_program(recursive)
    first, revise = (recursive.orchestrate.lm.engine, recursive.revise.lm.engine)
    assert first.logits_processor.format == WorkflowFormat(2, 2, conductor_step=True).fit(96)
    assert revise.logits_processor.format == WorkflowFormat(2, 2, allow_empty=True).fit(96)
    for question in ("What is 2 + 2?", "Name a prime.", "Sort [3, 1, 2].", "Spell cat."):
        prediction = recursive(question=question)
        rounds = prediction.rounds or [prediction]
        assert all(r.error is None for r in rounds), [str(r.error) for r in rounds]


@needs_xgrammar
@pytest.mark.parametrize("worker_ids", ["numbers", "names"])
@pytest.mark.parametrize("max_depth", [0, 1])
def test_each_round_samples_only_workflows_it_may_run(tiny: ConductorLM, max_depth: int, worker_ids: str) -> None:
    from conductor.conductor_lm import constraint_factory
    from conductor.modules import SELF_NAME, Conductor, WorkerPool
    from conductor.testing import ScriptedWorker

    pool = WorkerPool([ScriptedWorker(name, lambda p: "1") for name in ("a", "b", "c")])
    program = Conductor(pool, max_steps=3, max_depth=max_depth, worker_ids=worker_ids)
    tokens = 96 if worker_ids == "numbers" else 128  # "conductor" takes more bytes than "3" (a byte tokenizer)
    grammar = constraint_factory(tiny, tokens)
    prompts = [program.prompt_messages(q) for q in ("What is 2 + 2?", "Name a prime.", "Sort [3, 1, 2].")]
    workers = []
    for depth in range(max_depth + 1):
        rows = tiny.sample(prompts, 8, max_new_tokens=tokens, seed=depth, logits_processor=grammar(program, depth))
        for sample in (s for row in rows for s in row):
            assert sample.finish_reason == "stop"
            reply = program.read_completion(sample.text, depth)
            assert reply.error is None, f"round {depth}: {reply.error}\n{sample.text}"
            workers.append((depth, [step.worker for step in reply.workflow.steps]))
    own_id = len(pool)
    assert all(own_id not in chosen for depth, chosen in workers if depth == max_depth)
    if max_depth:  # the seeds sample both: the conductor's own id first, then keeping the answer
        assert any(chosen[-1:] == [own_id] for depth, chosen in workers if depth == 0)
        assert any(not chosen for depth, chosen in workers if depth == 1)
    names = None if worker_ids == "numbers" else (*pool.names, SELF_NAME)
    calls_itself = Workflow((Step(0, "Go", ()), Step(own_id, "Check", "all"))).to_text(names)
    assert grammar(program, max_depth).accepts(calls_itself) is False
    assert grammar(program, 0).accepts(calls_itself) is bool(max_depth)


CONDUCTOR_PROMPT = """You coordinate three workers, Model 0, Model 1 and Model 2. Split the question into steps: \
give each step a worker, a short instruction, and the earlier steps it sees ("all" or []). Answer like this:
model_id = [0, 1]
subtasks = ["Plan the solution", "Solve it using the plan"]
access_list = [[], "all"]"""
QUESTIONS = (
    "What is 17 + 25?",
    "Write a Python function that reverses a string.",
    "Who wrote Hamlet?",
    "Solve x^2 = 16 for x.",
)


@pytest.mark.slow
@needs_xgrammar
def test_smollm2_samples_only_valid_workflows_under_the_constraint() -> None:
    from conductor.local import load_local_model

    try:
        model, tokenizer = load_local_model("smollm2-135m-instruct")
    except MissingDependency as exc:
        pytest.skip(str(exc))
    fmt = WorkflowFormat(3, 3).fit(160)
    constraint = WorkflowConstraint(tokenizer, fmt, vocab_size=model.config.vocab_size)
    rows = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": CONDUCTOR_PROMPT}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for q in QUESTIONS
    ]
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in rows]
    width = max(len(r) for r in ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=4,
            max_new_tokens=fmt.max_tokens(),
            logits_processor=LogitsProcessorList([constraint]),
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
        )
    new = output[:, width:]
    assert new.shape[0] == 16
    for row in new.tolist():
        assert eos in row, "a sample was cut before the grammar completed"
        Workflow.parse(tokenizer.decode(row, skip_special_tokens=True)).validate(3, Limits(max_steps=3))
