"""Program search over scripted workers: the space, the halving schedule, the budget, resuming, the report, and
teaching its winners over random pools.

The pool and the three kinds of question are the learning test's (``kinds.py``), given to the search without
labels unless a test says otherwise.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
from pathlib import Path

import dspy
import pydantic
import pytest

from conductor.errors import ConfigError
from conductor.modules import Conductor, ReplayStore, ReplayWorker, ToolWorker, WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK as DIRECT
from conductor.modules.programs import QUESTION_ALONE
from conductor.optimizers import (
    Candidate,
    ProgramSearchConfig,
    candidate_space,
    program_search,
    proposed_subtasks,
    searched_workflows,
    write_search_report,
)
from conductor.optimizers.finetune import TemplateStep
from conductor.optimizers.search import Outcome, SearchCost, SearchResult
from conductor.optimizers.search._neighbours import nearest
from conductor.optimizers.search._space import CHECK
from conductor.testing import ScriptedWorker
from tests.optimizers import kinds
from tests.optimizers.kinds import FAMILIES, right, workers

RIGHT_SHAPE = {"spell": ("reverse",), "add": ("add",), "shout": ("reverse", "shout")}


def example(family: str, i: int, *, labelled: bool = False) -> dspy.Example:
    return kinds.example(family, i, labelled=labelled)


def questions(indices: range, *, labelled: bool = False) -> list[dspy.Example]:
    """Questions of the three kinds interleaved, as a user's file mixes them."""
    return [example(f, i, labelled=labelled) for i in indices for f in FAMILIES]


def family_of(example: dspy.Example) -> str:
    return next(f for f in FAMILIES if FAMILIES[f][0](0).split()[0] == example.question.split()[0])


def shape(steps) -> tuple[str, ...]:
    return tuple(step.worker for step in steps)


# ---- the space ------------------------------------------------------------------------------------------------------
def test_the_space_holds_singles_checked_pairs_and_votes_within_the_step_limit() -> None:
    pool = WorkerPool([*workers(), ToolWorker("calc", lambda text: "4")])
    space = candidate_space(pool, samples=3, max_steps=5)
    names = [c.name for c in space]
    assert len(names) == len(set(names)), "candidate names are unique"
    assert names[:4] == ["reverse", "add", "shout", "calc"]  # singles first
    assert "reverse -> shout (verify)" in names and "reverse -> shout (refine)" in names and "add -> calc" in names
    assert "calc -> calc" not in names  # a tool never checks itself
    assert "reverse -> reverse (verify)" in names  # a model may check its own answer
    assert "add x3 -> calc" in names and not any(n.startswith("calc x3") for n in names)  # only models sample
    assert all(len(c.steps) <= 5 for c in space)
    pairs = [c for c in space if len(c.steps) == 2]
    single = {c.name: c.steps[0] for c in space if len(c.steps) == 1}
    assert all(c.steps[0] == single[c.name.split(" -> ")[0]] for c in pairs), (
        "a pair opens with its single worker's own step, so a replaying pool shares that answer"
    )
    assert all(len(c.steps) <= 2 for c in candidate_space(pool, samples=3, max_steps=2))
    by_name = {c.name: c for c in space}
    twin = by_name["reverse (plain) -> shout (verify)"]  # the same second step, its first one the question alone
    assert twin.steps[1] == by_name["reverse -> shout (verify)"].steps[1]
    assert twin.steps[0] == by_name["reverse (plain)"].steps[0]
    assert twin.steps[0] == TemplateStep(worker="reverse", subtask=QUESTION_ALONE, access=())
    assert not any(n.startswith("calc (plain)") for n in names)  # a tool reads the question as it is anyway
    alone = candidate_space(pool, pairs=False, samples=0)
    assert [c.name for c in alone] == [
        "reverse",
        "add",
        "shout",
        "calc",
        "reverse (plain)",
        "add (plain)",
        "shout (plain)",
    ]
    assert [c.steps[0].subtask for c in alone] == [DIRECT] * 4 + [QUESTION_ALONE] * 3
    proposed = candidate_space(pool, pairs=False, samples=0, plain=False, proposed=["Answer with the number only."])
    assert [c.name for c in proposed] == [
        "reverse [1]",
        "reverse [2]",
        "add [1]",
        "add [2]",
        "shout [1]",
        "shout [2]",
        "calc",
    ]


# ---- the search -----------------------------------------------------------------------------------------------------
def test_the_search_finds_each_kinds_workflow_from_unlabelled_questions(tmp_path: Path) -> None:
    pool = workers()
    program = Conductor(WorkerPool(pool), max_steps=4)
    trainset = questions(range(6))
    result = program_search(program, trainset, right, ProgramSearchConfig(first_rung=6), output_dir=tmp_path)
    for i, ex in enumerate(trainset):
        winner = result.winner(i)
        assert winner is not None and shape(winner.steps) == RIGHT_SHAPE[family_of(ex)], (ex.question, winner)
    assert len(result.rungs) >= 2 and result.rungs[-1]["candidates"] < result.rungs[0]["candidates"], result.rungs
    # shared samples: each distinct prompt is one call (a pair reuses its single worker's answer), so far fewer calls
    # than the steps of every candidate on every question; a model asked plainly is sent the question alone, its own
    # prompt, and those calls are counted too
    assert all(len(w.prompts) == len(set(w.prompts)) for w in pool)
    asked = {ex.question for ex in trainset}
    plain_calls = sum(prompt in asked for w in pool for prompt in w.prompts)
    steps_run = sum(o.steps for row in result.outcomes for name, o in row.items() if not name.endswith("(plain)"))
    assert sum(w.calls for w in pool) == result.cost.worker_calls, result.cost
    assert plain_calls > 0 and result.cost.worker_calls - plain_calls < 0.6 * steps_run, (result.cost, steps_run)
    assert result.cost.tokens > 0 and result.cost.wall_s > 0


def test_successive_halving_keeps_a_minority_kinds_only_right_workflow() -> None:
    # three "shout" questions among 24: by mean score their pair is near the bottom, but it alone answers them. The
    # search shuffles the questions with random.Random(seed); the shout questions are put where the first rung has
    # them (the first rung's 8 questions hold 3 shout, 3 spell and 2 add).
    order = list(range(24))
    random.Random(0).shuffle(order)
    shout = {order[0]: 0, order[3]: 1, order[6]: 2}
    others = iter([example("spell", i) for i in range(11)] + [example("add", i) for i in range(10)])
    trainset = [example("shout", shout[i]) if i in shout else next(others) for i in range(24)]
    program = Conductor(WorkerPool(workers()), max_steps=2)
    result = program_search(program, trainset, right, ProgramSearchConfig(first_rung=8, eta=3, samples=0))
    assert [r["questions"] for r in result.rungs] == [8, 24]
    winners = [result.winner(i) for i in shout]
    assert all(w is not None and shape(w.steps) == ("reverse", "shout") for w in winners), winners
    winner = winners[0]
    survivors = [c for c in result.candidates if all(c.name in row for row in result.outcomes)]
    assert winner in survivors and len(survivors) < len(result.candidates) / 2


def test_the_worker_call_budget_is_never_exceeded() -> None:
    pool = workers()
    program = Conductor(WorkerPool(pool), max_steps=4)
    result = program_search(program, questions(range(6)), right, ProgramSearchConfig(max_worker_calls=40))
    assert result.exhausted
    assert sum(w.calls for w in pool) == result.cost.worker_calls <= 40
    with pytest.raises(pydantic.ValidationError):
        ProgramSearchConfig(max_worker_calls=0)


def test_a_search_stopped_mid_way_keeps_the_cost_it_had_spent(tmp_path: Path) -> None:
    pool = workers()
    seen: list[str] = []

    def right_then_stop(example: dspy.Example, prediction: dspy.Prediction) -> bool:
        seen.append(example.question)
        if seen[0] != example.question:  # the second question: stop, as Ctrl-C would
            raise KeyboardInterrupt
        return right(example, prediction)

    with pytest.raises(KeyboardInterrupt):
        program_search(
            Conductor(WorkerPool(pool), max_steps=2), questions(range(2)), right_then_stop, output_dir=tmp_path
        )
    saved = json.loads((tmp_path / "search.json").read_text())
    assert 0 < saved["worker_calls"] <= sum(w.calls for w in pool)  # the first question's calls, kept


def test_a_search_run_again_resumes_without_calling_a_worker_for_scored_pairs(tmp_path: Path) -> None:
    trainset = questions(range(4))
    first = program_search(Conductor(WorkerPool(workers()), max_steps=4), trainset, right, output_dir=tmp_path)
    again = workers()
    second = program_search(Conductor(WorkerPool(again), max_steps=4), trainset, right, output_dir=tmp_path)
    assert sum(w.calls for w in again) == 0
    assert [second.winner(i) for i in range(len(trainset))] == [first.winner(i) for i in range(len(trainset))]
    assert second.cost.worker_calls == first.cost.worker_calls  # the cost so far is carried over, not reset


def test_a_search_over_edited_data_scores_only_the_questions_it_has_not_seen(tmp_path: Path) -> None:
    def search(trainset: list[dspy.Example]) -> tuple[SearchResult, list[str]]:
        """The result, and the questions of the pairs it scored (not replayed from ``scores.jsonl``)."""
        scores = tmp_path / "scores.jsonl"
        before = len(scores.read_text().splitlines()) if scores.exists() else 0
        program = Conductor(WorkerPool(workers()), max_steps=4)
        config = ProgramSearchConfig(first_rung=len(trainset))  # one rung: every candidate on every question
        result = program_search(program, trainset, right, config, output_dir=tmp_path)
        scored = [json.loads(line)["question"] for line in scores.read_text().splitlines()[before:]]
        return result, [trainset[i].question for i in scored]

    trainset = questions(range(4))
    search(trainset)
    fresh = example("add", 9)  # one question replaced by a new one, and the rest reordered
    edited = [fresh, *reversed(trainset[1:])]
    result, scored = search(edited)
    assert scored and set(scored) == {fresh.question}  # the new question's pairs alone
    assert [shape(result.winner(i).steps) for i in range(len(edited))] == [RIGHT_SHAPE[family_of(e)] for e in edited]
    assert search(edited)[1] == []
    relabelled = [fresh.copy(answer="a different answer"), *edited[1:]]  # a label fixed: its old scores are stale
    scored = search(relabelled)[1]
    assert scored and set(scored) == {fresh.question}


def sampling_add(seed: int) -> ScriptedWorker:
    """``add`` as a sampled model: each call right or wrong by a coin of its own ``seed``."""
    coin = random.Random(seed)
    return ScriptedWorker("add", lambda prompt: kinds.add(prompt) if coin.random() < 0.5 else "about ten")


def test_a_candidate_added_to_a_resumed_search_is_scored_on_the_samples_its_first_step_had(tmp_path: Path) -> None:
    trainset = [example("add", i) for i in range(8)]

    def singles(**templates: list[dict]) -> ProgramSearchConfig:
        return ProgramSearchConfig(pairs=False, samples=0, propose=False, first_rung=len(trainset), templates=templates)

    program = Conductor(WorkerPool([sampling_add(0)]), max_steps=2)
    first = program_search(program, trainset, right, singles(), output_dir=tmp_path)
    alone = [first.outcomes[i]["add"].score for i in range(len(trainset))]
    assert 0 < sum(alone) < len(trainset)  # sampled: some right, some wrong
    # another sitting, whose add would sample otherwise, adds a pair that opens with add's step: shouting an answer
    # in capitals changes no digit, so on the same sample the pair scores as add alone did
    template = [{"worker": "add", "subtask": DIRECT, "access": []}, {"worker": "shout", "subtask": "Shout it."}]
    resampled = sampling_add(1)
    program = Conductor(WorkerPool([resampled, ScriptedWorker("shout", kinds.shout)]), max_steps=2)
    second = program_search(program, trainset, right, singles(add_then=template), output_dir=tmp_path)
    assert [second.outcomes[i]["add_then"].score for i in range(len(trainset))] == alone
    assert resampled.calls == 0  # every add prompt was answered from the folder's samples, none paid twice


def test_a_search_whose_pool_keeps_its_samples_elsewhere_adds_no_store_of_its_own(tmp_path: Path) -> None:
    store, sampled = ReplayStore(tmp_path / "shared.sqlite"), sampling_add(0)
    program = Conductor(WorkerPool([ReplayWorker(sampled, store)]), max_steps=1)
    program_search(program, [example("add", i) for i in range(2)], right, output_dir=tmp_path / "search")
    assert len(store) == sampled.calls > 0 and not (tmp_path / "search" / "replay.sqlite").exists()


def test_pairs_an_older_version_wrote_without_a_question_key_are_kept_and_scored_again(tmp_path: Path) -> None:
    trainset = questions(range(1))
    program_search(Conductor(WorkerPool(workers()), max_steps=2), trainset, right, output_dir=tmp_path)
    scores = tmp_path / "scores.jsonl"
    unkeyed = [
        json.dumps({k: v for k, v in json.loads(line).items() if k != "key"})
        for line in scores.read_text().splitlines()
    ]
    scores.write_text("".join(line + "\n" for line in unkeyed))
    program_search(Conductor(WorkerPool(workers()), max_steps=2), trainset, right, output_dir=tmp_path)
    lines = scores.read_text().splitlines()
    assert lines[: len(unkeyed)] == unkeyed  # nothing the older version wrote is lost
    assert len(lines) == 2 * len(unkeyed) and all("key" in json.loads(line) for line in lines[len(unkeyed) :])


def test_a_search_killed_mid_write_scores_the_cut_pair_again(tmp_path: Path) -> None:
    trainset = questions(range(2))
    program_search(Conductor(WorkerPool(workers()), max_steps=2), trainset, right, output_dir=tmp_path)
    scores = tmp_path / "scores.jsonl"
    lines = scores.read_text().splitlines()
    scores.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # the last line cut short
    again = workers()
    result = program_search(Conductor(WorkerPool(again), max_steps=2), trainset, right, output_dir=tmp_path)
    assert scores.read_text().splitlines() == lines  # the cut pair alone is scored again...
    assert sum(w.calls for w in again) == 0  # ...on the samples it had, kept beside the scores
    assert all(result.winner(i) is not None for i in range(len(trainset)))
    program_search(Conductor(WorkerPool(workers()), max_steps=2), trainset, right, output_dir=tmp_path)
    assert scores.read_text().splitlines() == lines  # the pair scored again was kept: nothing is scored a third time


def test_unusable_input_is_refused_before_any_worker_runs() -> None:
    pool = workers()
    program = Conductor(WorkerPool(pool), max_steps=2)
    with pytest.raises(ConfigError, match="at least one training question"):
        program_search(program, [], right)
    bad = [example("spell", 0), dspy.Example(question="no inputs declared"), dspy.Example(q="x").with_inputs("q")]
    with pytest.raises(ConfigError) as error:
        program_search(program, bad, right)
    assert "example 1 has no input fields" in str(error.value) and "example 2" in str(error.value)
    config = ProgramSearchConfig(templates={"mine": [{"worker": "gpt", "subtask": "Solve."}]})
    with pytest.raises(ConfigError, match="lacks: \\['gpt'\\]"):
        program_search(program, [example("spell", 0)], right, config)
    assert sum(w.calls for w in pool) == 0


def test_hand_written_templates_are_scored_beside_the_space() -> None:
    template = [{"worker": "reverse", "subtask": "Reverse.", "access": []}, {"worker": "shout", "subtask": "Shout."}]
    config = ProgramSearchConfig(templates={"reverse then shout": template}, pairs=False, samples=0)
    result = program_search(Conductor(WorkerPool(workers()), max_steps=2), [example("shout", 0)], right, config)
    assert result.winner(0).name == "reverse then shout"


def test_the_search_proposes_instructions_from_the_answers_form() -> None:
    # a yes/no question a worker answers right only when told the answers' form: as it is, it explains
    def chatty(prompt: str) -> str:
        told = re.search(r"one of: (\w+), (\w+)\.", prompt)
        return "True" if told else "Let me think about which way it goes."

    trainset = [dspy.Example(question=f"Is {i} even?", answer="True").with_inputs("question") for i in range(3)]
    trainset += [dspy.Example(question=f"Is {i} odd?", answer="False").with_inputs("question") for i in range(1)]
    program = Conductor(WorkerPool([ScriptedWorker("chatty", chatty)]), max_steps=1)
    found = program_search(program, trainset, right, ProgramSearchConfig(samples=0, plain=False))
    assert [c.steps[0].subtask for c in found.candidates][1:] == ["Answer with one of: False, True."]
    assert found.winner(0) is not None and "one of" in found.winner(0).steps[0].subtask
    unproposed = program_search(program, trainset, right, ProgramSearchConfig(samples=0, propose=False, plain=False))
    assert len(unproposed.candidates) == 1 and unproposed.winner(0) is None


def test_proposals_need_a_closed_set_or_numbers() -> None:
    def labelled(*answers: object, field: str = "answer") -> list[dspy.Example]:
        return [dspy.Example(question="q", **{field: a}).with_inputs("question") for a in answers]

    assert proposed_subtasks(labelled("A", "B", "A", "C", "B", "C"), ["answer"]) == ["Answer with one of: A, B, C."]
    assert proposed_subtasks(labelled("12", "-3.5", "1,024"), ["answer"]) == ["Answer with the number only."]
    assert proposed_subtasks(labelled("12", "True", "False", "7", "True", "False"), ["answer"]) == [
        "Answer with one of: False, True.",
        "Answer with the number only.",
    ]  # two kinds of question mixed: a proposal for each
    assert proposed_subtasks(labelled("Paris", "Rome", "Oslo", "Bern", "Kyiv", "Riga", "12"), ["answer"]) == []
    assert proposed_subtasks(labelled(True, False, True, True), ["answer"]) == ["Answer with one of: False, True."]
    assert proposed_subtasks(labelled("A", "B", "C"), ["answer"]) == []  # three values seen once each: not a set
    assert proposed_subtasks(labelled("Paris", "7", "dog", "Rome"), ["answer"]) == []
    assert proposed_subtasks(labelled("yes", "no", "no", "yes", field="verdict"), ["reason", "verdict"]) == [
        "Give the verdict with one of: no, yes."
    ]  # several output fields: the one with a form is named
    assert proposed_subtasks(labelled(), ["answer"]) == []


# ---- the report ------------------------------------------------------------------------------------------------------
def test_the_report_groups_unlabelled_questions_by_winner_and_labelled_ones_by_label(tmp_path: Path) -> None:
    program = Conductor(WorkerPool(workers()), max_steps=2)
    result = program_search(
        program, questions(range(3), labelled=True), right, ProgramSearchConfig(samples=0, propose=False, plain=False)
    )
    write_search_report(result, tmp_path / "by-group")
    rows = json.loads((tmp_path / "by-group" / "oracle.json").read_text())
    assert {r["kind"] for r in rows} == {"reverse", "add", "reverse -> shout (verify)"}
    write_search_report(result, tmp_path / "by-label", label="family")
    rows = {r["kind"]: r for r in json.loads((tmp_path / "by-label" / "oracle.json").read_text())}
    assert rows["shout"]["best"] == "reverse -> shout (verify)" and rows["shout"]["best_score"] == 1.0
    assert rows["shout"]["best_single_score"] == 0.0 and rows["add"]["best_single"] == "add"
    table = (tmp_path / "by-label" / "oracle.md").read_text()
    assert "| shout | 3 | reverse -> shout (verify) | 1.00 |" in table
    lines = (tmp_path / "by-label" / "questions.jsonl").read_text().splitlines()
    assert len(lines) == 9 and json.loads(lines[0])["winner"] == "reverse"
    summary = json.loads((tmp_path / "by-label" / "search.json").read_text())
    assert summary["candidates"] == len(result.candidates) and summary["worker_calls"] == result.cost.worker_calls


# ---- teaching --------------------------------------------------------------------------------------------------------
def test_teaching_falls_back_to_the_best_candidate_a_random_pool_can_run() -> None:
    pool = WorkerPool(workers())
    program = Conductor(pool, max_steps=2)
    trainset = questions(range(3))
    result = program_search(program, trainset, right, ProgramSearchConfig(samples=0))
    examples = searched_workflows(pool, result, pools_per_question=8, seed=1)
    assert len(examples) == 8 * len(trainset)
    taught = {}
    for inputs, workflow, subpool in examples:
        family = family_of(dspy.Example(**inputs))
        names = tuple(subpool.names[s.worker] for s in workflow.steps)
        if set(RIGHT_SHAPE[family]) <= set(subpool.names):
            assert names == RIGHT_SHAPE[family], (family, subpool.names, names)
        taught.setdefault(family, set()).add(names)
    # a pool without "shout" can't run the shout kind's pair: it is taught the next best the pool can run
    assert len(taught["shout"]) > 1


def test_questions_no_candidate_answers_are_taught_the_best_on_average() -> None:
    pool = WorkerPool(workers())
    program = Conductor(pool, max_steps=2)
    impossible = dspy.Example(question="Sing 'la'.", answer="never").with_inputs("question")
    trainset = [*questions(range(2)), impossible]
    result = program_search(program, trainset, right, ProgramSearchConfig(samples=0))
    assert result.winner(len(trainset) - 1) is None
    best = result.overall()[0]
    examples = searched_workflows(pool, result, pools_per_question=1, min_pool_size=3, seed=0)
    inputs, workflow, subpool = examples[-1]
    assert inputs == {"question": "Sing 'la'."}
    assert tuple(subpool.names[s.worker] for s in workflow.steps) == shape(best.steps)


def test_questions_the_budget_left_unscored_are_their_own_group(tmp_path: Path) -> None:
    program = Conductor(WorkerPool(workers()), max_steps=2)
    config = ProgramSearchConfig(samples=0, max_worker_calls=12)
    result = program_search(program, questions(range(3)), right, config)
    assert result.exhausted and any(not row for row in result.outcomes)
    write_search_report(result, tmp_path)
    kinds_found = {r["kind"]: r["questions"] for r in json.loads((tmp_path / "oracle.json").read_text())}
    assert kinds_found["not scored (the budget ran out)"] == sum(not row for row in result.outcomes)


def test_questions_are_grouped_by_their_wording() -> None:
    texts = [kinds.example(f, i).question for i in range(4) for f in FAMILIES]  # interleaved, as a user's file
    for i, near in enumerate(nearest(texts, 4)):
        kind = family_of(dspy.Example(question=texts[i]))
        alike = [j for j, _ in near[1:] if family_of(dspy.Example(question=texts[j])) == kind]
        assert near[0] == (i, 1.0) and len(alike) >= 2, (texts[i], near)  # "cat" is in two kinds
        assert all(1 > a >= b >= 0 for (_, a), (_, b) in itertools.pairwise(near[1:]))
    assert nearest(["a b", "c"], 5) == [((0, 1.0), (1, 0.0)), ((1, 1.0), (0, 0.0))]  # fewer texts than asked: all


def test_a_kind_is_taught_the_workflow_right_most_often_on_questions_like_it() -> None:
    # navigate-like questions: "plain" right on 7 of 8, "short" (fewer tokens) on 2; add questions: only "short".
    # Over all questions "short" wins more, so neither tokens, nor the overall best, nor luck on one question may
    # decide the navigate kind: each of its questions is taught "plain", also the one only "short" got right.
    short, plain = (Candidate(n, (TemplateStep(worker="w", subtask=n),)) for n in ("short", "plain"))
    walk = [(True, True), (False, True), (False, True), (True, False)] + [(False, True)] * 4
    questions, rows = navigate_and_add(walk, adds=12)
    result = SearchResult([short, plain], questions, rows, SearchCost(), neighbours=5)
    assert result.overall()[0] == short
    assert [result.winner(i) for i in range(8)] == [plain] * 8
    assert [result.winner(i) for i in range(8, 20)] == [short] * 12
    # one question as its own neighbourhood: its own winner
    assert SearchResult([short, plain], questions, rows, SearchCost(), neighbours=1).winner(3) == short
    # dollars don't outweigh a rate the data tells apart: "plain" at $1 is still taught on navigate
    paid = [{**r, "plain": Outcome(r["plain"].score, 1, 30, 1.0)} for r in rows]
    assert SearchResult([short, plain], questions, paid, SearchCost(), neighbours=5).winner(0) == plain


def test_a_kind_near_chance_is_taught_one_workflow_the_cheaper_of_those_the_data_cant_tell_apart() -> None:
    # navigate-like questions where "plain" (right on 3 of 6) and "short" (2 of 6) are right on different questions:
    # one sample each can't tell them apart, so every question of the kind is taught the same one, the cheaper in
    # dollars ("plain" here), not whichever led on its own neighbours; a question none is right on gets it too.
    short, plain = (Candidate(n, (TemplateStep(worker="w", subtask=n),)) for n in ("short", "plain"))
    walk = [(True, False), (False, True), (False, True), (True, False), (False, False), (False, True)]
    questions, rows = navigate_and_add(walk, adds=6)
    rows = [{**r, "short": Outcome(r["short"].score, 1, 10, 0.5)} for r in rows]  # "short" costs more
    result = SearchResult([short, plain], questions, rows, SearchCost(), neighbours=5)
    assert [result.preferences(i)[0] for i in range(6)] == [plain] * 6  # by rate alone: short, plain, plain, short
    loose = SearchResult([short, plain], questions, rows, SearchCost(), neighbours=1)  # each question alone
    assert {loose.winner(i).name for i in (0, 1)} == {"short", "plain"}  # what the tie rule keeps from the teaching


def navigate_and_add(walk: list[tuple[bool, bool]], adds: int) -> tuple[list[dspy.Example], list[dict]]:
    """Navigate-like questions, one per ``(short right, plain right)`` of ``walk``, then ``adds`` add questions only
    "short" answers, with each question's outcomes ("short" 10 tokens, "plain" 30)."""

    def row(short_right: bool, plain_right: bool) -> dict[str, Outcome]:
        return {"short": Outcome(float(short_right), 1, 10, 0.0), "plain": Outcome(float(plain_right), 1, 30, 0.0)}

    questions = [
        dspy.Example(question=f"Take {i} steps north, then turn around. Back?").with_inputs("question")
        for i in range(len(walk))
    ]
    questions += [example("add", i) for i in range(adds)]
    return questions, [row(*w) for w in walk] + [row(True, False) for _ in range(adds)]


def test_a_pool_that_can_run_nothing_right_near_a_question_is_drawn_again() -> None:
    # "pair" (workers a then b) is right on every question, "a" alone and "b" alone on none: a pool without both a
    # and b has no workflow with a chance, so no such pool is taught anything (it is drawn again).
    steps = {"pair": ("a", "b"), "a": ("a",), "b": ("b",)}
    candidates = [Candidate(n, tuple(TemplateStep(worker=w, subtask=n) for w in ws)) for n, ws in steps.items()]
    questions = [example("add", i) for i in range(4)]
    rows = [{n: Outcome(float(n == "pair"), len(ws), 10, 0.0) for n, ws in steps.items()} for _ in questions]
    result = SearchResult(candidates, questions, rows, SearchCost(), neighbours=3)
    assert [c.name for c in result.prospects(0)] == ["pair"]
    pool = WorkerPool([ScriptedWorker(name) for name in ("a", "b", "c")])
    taught = searched_workflows(pool, result, pools_per_question=20, min_pool_size=1, seed=0)
    assert len(taught) == 20 * len(questions)
    assert all({"a", "b"} <= set(subpool.names) for _, _, subpool in taught)
    assert {tuple(subpool.names[s.worker] for s in workflow.steps) for _, workflow, subpool in taught} == {("a", "b")}


def test_instructions_longer_than_the_conductor_can_write_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    # a conductor decoding under the workflow grammar writes each subtask within the bytes its max_tokens leaves
    from types import SimpleNamespace

    from conductor.conductor_lm import WorkflowFormat

    program = Conductor(WorkerPool(workers()), max_steps=2)
    form = WorkflowFormat(len(program.pool), 2, max_subtask_bytes=22)
    program.orchestrate.lm = SimpleNamespace(engine=SimpleNamespace(logits_processor=SimpleNamespace(format=form)))
    config = ProgramSearchConfig(samples=0, propose=False, subtasks=["Solve."])
    with caplog.at_level(logging.WARNING, logger="conductor.optimizers.search._search"):
        program_search(program, questions(range(1)), right, config)
    (warning,) = [r.getMessage() for r in caplog.records if "grammar" in r.getMessage()]
    assert "at most 22 bytes" in warning and repr(CHECK) in warning and "'Solve.'" not in warning
    caplog.clear()
    program.orchestrate.lm = None  # no grammar: anything can be written
    with caplog.at_level(logging.WARNING, logger="conductor.optimizers.search._search"):
        program_search(program, questions(range(1)), right, config)
    assert not [r for r in caplog.records if "grammar" in r.getMessage()]
