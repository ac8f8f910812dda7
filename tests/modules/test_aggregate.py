"""The ``vote`` and ``check`` tools, fed through the executor's real prompts by scripted candidate workers."""

from __future__ import annotations

import re

import pytest

from conductor.errors import ToolInputError
from conductor.modules import WorkerPool, choice_index
from conductor.modules.baselines import FixedPipeline
from conductor.modules.tools._aggregate import (
    CheckWorker,
    VoteWorker,
    function_tests,
    options,
    parse_prompt,
    vote,
)
from conductor.testing import ScriptedWorker

MULTIPLE_CHOICE = "Which colour is the sky on a clear day?\n\nA. green\nB. blue\nC. red"
VALID_OR_INVALID = (
    "All cats are animals. Tom is a cat. So Tom is an animal.\nValid or invalid?\nOptions:\n- valid \n- invalid"
)
STUB = '''def add(a: int, b: int) -> int:
    """Add two numbers.
    >>> add(2, 3)
    5
    >>> add(-1, 1)
    0
    """
'''


def _candidates(responses: list[str]) -> ScriptedWorker:
    """A worker whose step ``i`` (its subtask says "candidate i") answers ``responses[i]``: steps may run side by
    side, so the answer must not depend on the order of calls."""

    def answer(prompt: str) -> str:
        return responses[int(re.findall(r"candidate (\d+)", prompt)[-1])]

    return ScriptedWorker("candidates", answer)


def _run(tool, task: str, responses: list[str], access="all"):
    """``len(responses)`` candidate steps that see nothing, then ``tool`` seeing ``access``: the prediction."""
    pool = WorkerPool([_candidates(responses), tool])
    steps = [(0, "", f"Give candidate {i}.", []) for i in range(len(responses))]
    return FixedPipeline(pool, [*steps, (1, "", "Pick the answer.", access)])(question=task)


def test_vote_takes_the_majority_option_however_it_is_named() -> None:
    prediction = _run(VoteWorker(), MULTIPLE_CHOICE, ["A", "It is blue.", "Answer: (B)", "no idea"])
    assert prediction.response == "Answer: B"


def test_vote_compares_numbers_by_value() -> None:
    prediction = _run(VoteWorker(), "How many?", ["Answer: 999", "so it is 1,000.0", "Answer: 1000"])
    assert prediction.response == "Answer: 1000"


def test_vote_breaks_ties_by_the_earliest_step() -> None:
    assert _run(VoteWorker(), "How many?", ["Answer: 8", "Answer: 7"]).response == "Answer: 8"
    assert _run(VoteWorker(), "Capital?", ["Answer: Paris", "london", "paris."]).response == "Answer: Paris"


def test_vote_sees_only_the_steps_its_access_list_allows() -> None:
    assert _run(VoteWorker(), "How many?", ["Answer: 8", "Answer: 7", "Answer: 7"], [0]).response == "Answer: 8"
    alone = _run(VoteWorker(), "How many?", ["Answer: 8"], [])
    assert alone.response is None
    assert "nothing to vote on" in str(alone.error)


def test_a_voted_list_of_options_stays_a_list_and_picks_none() -> None:
    """Gemma echoes a yes/no question's options; voted on, the list came back as "Answer: - Yes" on its first line,
    which the program's answer and the metric read as a pick of Yes."""
    task = "Do you return to the starting point?\nOptions:\n- Yes\n- No"
    echo = "- Yes\n- No\n\nYour subtask:\nAnswer.\n\nAnswer:\n- Yes\n- No"
    prediction = _run(VoteWorker(), task, [echo])
    assert choice_index(prediction.answer, ["Yes", "No"]) is None
    assert _run(VoteWorker(), task, [echo, "Answer: No", "No."]).answer == "No"  # a real majority still wins


def test_vote_refuses_when_no_step_answers() -> None:
    prediction = _run(VoteWorker(), MULTIPLE_CHOICE, ["no idea", "hmm"])
    assert "gives an answer to vote on" in str(prediction.error)


def test_a_response_that_echoes_a_step_header_stays_one_response() -> None:
    echo = "Step 0 (Model 0) subtask: Give candidate 0.\nStep 0 (Model 0) response:\nAnswer: 3"
    pool = WorkerPool([_candidates(["Answer: 3", echo]), ScriptedWorker("tool", lambda prompt: prompt)])
    steps = [(0, "", "Give candidate 0.", []), (0, "", "Give candidate 1.", []), (1, "", "Look.", "all")]
    prompt = FixedPipeline(pool, steps)(question="Q?").response
    assert parse_prompt(prompt).responses == ("Answer: 3", echo)
    assert parse_prompt(prompt).task == "Q?"
    assert parse_prompt(prompt).subtask == "Look."


def test_options_are_the_last_lettered_run() -> None:
    assert options(MULTIPLE_CHOICE).texts == ("green", "blue", "red")
    assert options(MULTIPLE_CHOICE).names == ("A", "B", "C")
    assert options("Pick one:\n(A) yes\n(B) no").texts == ("yes", "no")
    assert options("A. only one option").texts == ()


def test_unlettered_options_are_the_bulleted_list_under_an_options_line() -> None:
    """BIG-Bench-Hard lists yes/no and valid/invalid questions' options so ("- valid " with its trailing space); the
    tools name such an option by its text, since it has no letter."""
    assert options(VALID_OR_INVALID).texts == ("valid", "invalid")
    assert options(VALID_OR_INVALID).names == ("valid", "invalid")
    assert options("Facts:\n- ice is cold\n- fire is hot\nIs ice cold?").texts == ()  # a list, but not of options
    assert options("Options:\n- only one").texts == ()
    assert options(f"{VALID_OR_INVALID}\n(A) yes\n(B) no").names == ("A", "B")  # letters, where a task has both


def test_an_echoed_option_list_names_no_option() -> None:
    assert choice_index("A. green\nB. blue\nC. red", ["green", "blue", "red"]) is None
    assert choice_index("The answer is C", ["green", "blue", "red"]) == 2


def test_check_picks_the_option_the_latest_candidate_names() -> None:
    assert _run(CheckWorker(), MULTIPLE_CHOICE, ["Answer: A", "Answer: B"]).response == "Answer: B"
    assert _run(CheckWorker(), MULTIPLE_CHOICE, ["Answer: A", "not sure"]).response == "Answer: A"


def test_check_and_vote_answer_an_unlettered_option_by_its_text() -> None:
    """Before, ``check`` saw no options in such a task and looked for arithmetic to recompute: it failed on every
    formal_fallacies question."""
    checked = _run(CheckWorker(), VALID_OR_INVALID, ["The argument is deductively valid."])
    assert checked.response == "Answer: valid"
    assert choice_index(checked.answer, ["invalid", "valid"]) == 1  # as the benchmark's metric reads it
    voted = _run(VoteWorker(), VALID_OR_INVALID, ["Answer: invalid", "It is valid.", "so: invalid"])
    assert voted.response == "Answer: invalid"


def test_check_maps_free_text_to_the_closest_option() -> None:
    prediction = _run(CheckWorker(), MULTIPLE_CHOICE, ["On a clear day it looks blueish, like blue water"])
    assert prediction.response == "Answer: B"
    assert "names one of the options" in str(_run(CheckWorker(), MULTIPLE_CHOICE, ["no idea"]).error)


def test_check_recomputes_the_candidates_arithmetic() -> None:
    prediction = _run(CheckWorker(), "What is 17 * 23 + 4?", ["17*23+4 = 390"])
    assert prediction.response == "Answer: 395"
    assert "arithmetic expression" in str(_run(CheckWorker(), "Spell it.", ["no numbers here"]).error)


def test_check_needs_access_to_a_candidate() -> None:
    assert "nothing to check" in str(_run(CheckWorker(), "What is 2+2?", ["4"], []).error)


def test_function_tests_reads_doctests_and_arrow_examples() -> None:
    assert function_tests(STUB, "add") == [("add(2, 3)", "5"), ("add(-1, 1)", "0")]
    assert function_tests('def f(x):\n    """f(2) ➞ 4\n    f(3) == 9."""\n', "f") == [("f(2)", "4"), ("f(3)", "9")]


def test_check_keeps_the_candidate_program_that_passes_the_examples() -> None:
    wrong, right, broken = "return a - b", "return a + b", "return a +"
    prediction = _run(CheckWorker(), STUB, [broken, wrong, right, "```python\ndef add(a, b):\n    return b + a\n```"])
    assert "# passes 2 of the task's 2 examples" in prediction.response
    assert "return a + b" in prediction.response  # the earliest of the two that pass
    assert "return b + a" not in prediction.response


def test_pool_configs_build_the_aggregating_tools() -> None:
    pool = WorkerPool.from_config(
        {
            "show_descriptions": True,
            "workers": [{"name": "v", "kind": "tool", "tool": "vote"}, {"name": "c", "kind": "tool", "tool": "check"}],
        }
    )
    assert isinstance(pool[0], VoteWorker) and isinstance(pool[1], CheckWorker)
    assert "Majority vote" in pool.describe() and "Checks the candidate answers" in pool.describe()


def test_vote_called_directly_wants_earlier_steps() -> None:
    with pytest.raises(ToolInputError, match="nothing to vote on"):
        vote("Overall task:\nQ?\n\nYour subtask:\nVote.")
