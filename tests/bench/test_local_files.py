"""One's own data: JSONL, CSV and Parquet files read through ``datasets``' local loaders (offline), bad rows reported
and left out, the built-in metrics, and a program compiled and evaluated from a JSONL file through the CLI."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import dspy
import pytest
import yaml

pytest.importorskip("datasets")

from conductor.bench import validate_config
from conductor.bench.datasets import (
    BadRow,
    DataFile,
    choice_metric,
    contains_metric,
    exact_metric,
    number_metric,
    split,
)
from conductor.errors import ConfigError

GOOD = [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(1, 9)]
MALFORMED = [
    '{"question": "What is 9 + 9?"}',  # no answer
    '{"question": ["What is", "10 + 10?"], "answer": 20}',  # a list, not text
    "{this is not json",
    '{"question": "   ", "answer": 3}',  # empty
    '{"question": "What is 11 + 11?", "answer": "twenty-two"}',  # not a number, for the number metric
]


@pytest.fixture(autouse=True)
def _offline(offline_in_a_fresh_cache: None) -> None:
    """Every test here reads local files only."""


def write_jsonl(path: Path) -> Path:
    """GOOD's eight rows with MALFORMED's five lines between them (lines 3, 5, 7, 9 and 11) and blank lines (12 and
    the last), which are no rows."""
    lines = [json.dumps(row) for row in GOOD]
    for offset, bad in enumerate(MALFORMED):
        lines.insert(2 + 2 * offset, bad)
    lines.insert(11, "")
    path.write_text("\n".join(lines) + "\n\n")
    return path


def test_a_jsonl_file_keeps_its_good_rows_and_reports_the_bad_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(tmp_path / "sums.jsonl")
    with caplog.at_level(logging.WARNING):
        rows = DataFile(path=path).read("number")
    assert [e.question for e in rows.examples] == [row["question"] for row in GOOD]
    assert [e.answer for e in rows.examples] == [str(row["answer"]) for row in GOOD]
    assert {e.family for e in rows.examples} == {"sums"} and set(rows.examples[0].inputs()) == {"question"}
    assert rows.records == 13
    assert rows.bad == [
        BadRow(3, "no 'answer'"),
        BadRow(5, "'question' is ['What is', '10 + 10?'], not text or a number"),
        BadRow(7, "not a JSON object"),
        BadRow(9, "'question' is empty"),
        BadRow(11, "'answer' is 'twenty-two', not a number"),
    ]
    assert rows.examples[-1].question == GOOD[-1]["question"]  # on line 14, after the blank line 12
    assert "skipped 5 of 13 rows (row 3: no 'answer'; row 5:" in caplog.text
    # Under the exact metric any text is an answer: row 11 is used.
    assert len(DataFile(path=path).read("exact").examples) == 9


def test_a_report_names_the_first_few_bad_rows_and_counts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "mostly_bad.jsonl"
    path.write_text("\n".join(['{"question": "q", "answer": "a"}', *(["{}"] * 8)]))
    report = DataFile(path=path).read().report()
    assert report.startswith("skipped 8 of 9 rows (row 2: no 'question'; row 3:") and report.endswith("and 3 more)")


def test_several_input_fields_make_one_question_and_other_fields_stay_as_labels(tmp_path: Path) -> None:
    path = tmp_path / "reading.jsonl"
    record = {"context": "Ann is 7.", "ask": "How old is Ann?", "gold": 7.0, "source": "x", "answer": "unused"}
    path.write_text(json.dumps(record))
    (example,) = DataFile(path=path, inputs=["context", "ask"], answer="gold").read("number").examples
    assert example.question == "context: Ann is 7.\nask: How old is Ann?"
    assert example.answer == "7" and example.source == "x"  # a whole float is written as an integer


def test_a_csv_file_stays_text_and_empty_cells_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "capitals.csv"
    path.write_text('q,a,note\nCapital of France?,Paris,\n"Capital of Italy, please?",Rome,x\n,Berlin,\nCapital?,,\n')
    rows = DataFile(path=path, inputs=["q"], answer="a").read()
    assert [(e.question, e.answer, e.note) for e in rows.examples] == [
        ("Capital of France?", "Paris", ""),
        ("Capital of Italy, please?", "Rome", "x"),
    ]
    assert rows.bad == [BadRow(3, "'q' is empty"), BadRow(4, "'a' is empty")]


def test_a_csv_with_numeric_looking_answers_keeps_them_as_written(tmp_path: Path) -> None:
    path = tmp_path / "codes.csv"
    path.write_text("question,answer\nZip of A?,007\nZip of B?,1.50\n")
    assert [e.answer for e in DataFile(path=path).read().examples] == ["007", "1.50"]


def test_a_parquet_file_with_multiple_choice_options(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    path = tmp_path / "quiz.parquet"
    pandas.DataFrame(
        {
            "question": ["Largest planet?", "Smallest planet?", None, "Hottest planet?", "Red planet?"],
            "choices": [["Mars", "Jupiter"], ["Mercury", "Venus"], ["a", "b"], ["Venus"], ["Mars", "Earth"]],
            "answer": ["B", "Mercury", "A", "A", "Pluto"],
        }
    ).to_parquet(path)
    rows = DataFile(path=path, options="choices").read("choice")
    assert [e.answer for e in rows.examples] == ["B", "A"]  # an option's text becomes its label
    assert rows.examples[0].question == "Largest planet?\n\nA. Mars\nB. Jupiter"
    assert rows.examples[0].options == ("Mars", "Jupiter")
    assert [row.number for row in rows.bad] == [3, 4, 5]
    assert "not a list of at least two options" in rows.bad[1].reason and "neither an option" in rows.bad[2].reason


def test_options_from_one_field_each(tmp_path: Path) -> None:
    path = tmp_path / "abcd.csv"
    path.write_text("question,a,b,right\n2 + 2?,3,4,b\n")
    (example,) = DataFile(path=path, options=["a", "b"], answer="right").read("choice").examples
    assert example.answer == "B" and example.options == ("3", "4")
    assert choice_metric(example, dspy.Prediction(answer="The answer is B")) == 1.0
    assert choice_metric(example, dspy.Prediction(answer="3")) == 0.0


def test_a_file_with_no_usable_row_or_no_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty_answers.jsonl"
    path.write_text('{"question": "q"}\n{"question": "r", "answer": null}\n')
    with pytest.raises(ConfigError, match=r"has no usable row: skipped 2 of 2 rows \(row 1: no 'answer'"):
        DataFile(path=path).read()
    with pytest.raises(ConfigError, match="no data file"):
        DataFile(path=tmp_path / "missing.jsonl").read()
    with pytest.raises(ConfigError, match="choice metric needs `options`"):
        DataFile(path=path).read("choice")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match=r"can't read .*broken.parquet as parquet"):
        DataFile(path=broken).read()


def test_a_file_spec_is_checked_when_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"can't tell the format of data\.txt"):
        DataFile(path=tmp_path / "data.txt")
    with pytest.raises(ValueError, match=r"both an input, the answer or an option: \['answer'\]"):
        DataFile(path=tmp_path / "a.jsonl", inputs=["question", "answer"])
    assert DataFile(path=tmp_path / "data.txt", format="csv").kind == "csv"


def test_the_builtin_metrics_read_the_answer_label() -> None:
    example = dspy.Example(question="q", answer="1,250")
    assert number_metric(example, dspy.Prediction(answer="It is 1250.")) == 1.0
    assert number_metric(example, dspy.Prediction(answer="1251")) == 0.0
    assert exact_metric(dspy.Example(answer="Paris"), dspy.Prediction(answer="paris.")) == 1.0
    assert exact_metric(dspy.Example(answer="Paris"), dspy.Prediction(answer="Lyon")) == 0.0


def test_a_bench_config_takes_a_file_relative_to_itself(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "sums.jsonl")
    config = validate_config(
        {
            "datasets": [{"name": "file", "args": {"path": "sums.jsonl", "metric": "number"}, "n": 2, "part": "all"}],
            "methods": [{"name": "one", "type": "single"}],
            "output": "out",
        },
        base_dir=tmp_path,
    )
    (spec,) = config.datasets
    examples = spec.load()
    assert len(examples) == 2 and spec.metric is number_metric
    expected = split(DataFile(path=tmp_path / "sums.jsonl").read("number").examples, 0, (1.0, 0.0, 0.0)).train[:2]
    assert examples == expected
    with pytest.raises(ConfigError, match=r"args\.metric"):
        validate_config(
            {
                "datasets": [{"name": "file", "args": {"path": "sums.jsonl", "metric": "fuzzy"}, "n": 2}],
                "methods": [{"name": "one", "type": "single"}],
                "output": "out",
            }
        )


# ---- through the CLI: compile and evaluate a program from a JSONL file ---------------------------------------------
POOL = {"workers": [{"name": "calc", "kind": "tool", "tool": "calculator"}]}


def run_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    """A tiny run: the random tiny conductor over a calculator, one few-shot phase and one GRPO step."""
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(POOL))
    config = {
        "program": {"pool": str(tmp_path / "pool.yaml"), "conductor": "tiny", "max_steps": 1, "max_tokens": 24},
        "data": data,
        "grpo": {"steps": 1, "batch_size": 1, "group_size": 2, "max_new_tokens": 16, "progress": False},
        "compile": {"few_shot": 1, "candidates": 0},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_compile_and_eval_a_program_from_a_jsonl_file_with_malformed_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture, one_torch_thread: None
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from conductor.cli import main

    data = {
        "file": {"path": str(write_jsonl(tmp_path / "sums.jsonl"))},
        "metric": "number",
        "fractions": [0.5, 0.25, 0.25],
    }
    config = run_config(tmp_path, data)
    with caplog.at_level(logging.WARNING):
        assert main(["compile", str(config)]) == 0
    assert "skipped 5 of 13 rows" in caplog.text
    held_out = json.loads((tmp_path / "run" / "held_out.json").read_text())
    assert {row["n"] for row in held_out.values()} == {2}  # 8 good rows split 4/2/2
    assert "| compiled |" in capsys.readouterr().out

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["eval", str(tmp_path / "run" / "best"), "--trust-code", "--config", str(config), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 2 and 0.0 <= result["accuracy"] <= 1.0 and set(result["by_family"]) == {"sums"}
    assert "row 7: not a JSON object" in caplog.text


def test_a_run_config_names_a_loader_or_a_file_not_both(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from conductor.cli import load_run_config

    both = {"loader": "m:f", "file": {"path": "x.jsonl"}, "metric": "exact"}
    for data, problem in (
        (both, "name either a `loader` or a `file`"),
        ({"metric": "exact"}, "name either a `loader` or a `file`"),
        ({"file": {"path": "x.jsonl"}, "args": {"a": 1}}, "`args` are a loader's"),
        ({"file": {"path": "x.jsonl"}, "metric": "close enough"}, "data.metric"),
    ):
        with pytest.raises(ConfigError, match=problem):
            load_run_config(run_config(tmp_path, data))


@pytest.mark.parametrize(
    ("answer", "reply", "right"),
    [
        ("Paris", "The capital of France is Paris.", 1.0),
        ("395", "17 * 23 + 4 = 395", 1.0),
        ("William Shakespeare", 'It was written by william  shakespeare ("Hamlet", 1600).', 1.0),
        ("39", "395", 0.0),  # a whole word, not a part of one
        ("Paris", "Parisian cooking", 0.0),
        ("", "anything", 0.0),
    ],
)
def test_the_contains_metric_finds_a_short_answer_in_a_chatty_reply(answer: str, reply: str, right: float) -> None:
    assert contains_metric(dspy.Example(answer=answer), dspy.Prediction(answer=reply)) == right
