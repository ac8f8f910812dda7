"""What long CLI commands show while they run: a bar with an ETA for each evaluation, log lines above it, and a
warning that a library repeats on every call shown once, with its count at the end. (``train`` and ``compile`` end to
end: tests/cli/test_train_compile.py.)"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import dspy
import pytest
import yaml

from conductor.cli import configure_logging, main
from conductor.cli._common import evaluation_progress

TRUNCATED = "LM response was truncated due to exceeding max_tokens=64."


class Echo(dspy.Module):
    """A program with no LM: answers each question with itself, and logs one of the library's warnings."""

    def forward(self, question: str) -> dspy.Prediction:
        logging.getLogger("conductor.tests").warning("a step was retried")
        return dspy.Prediction(answer=question)


def evaluate_echo(n: int, **evaluate: Any) -> float:
    examples = [dspy.Example(question=str(i), answer=str(i)).with_inputs("question") for i in range(n)]
    run = dspy.Evaluate(devset=examples, metric=lambda e, p, trace=None: e.answer == p.answer, **evaluate)
    return run(Echo()).score


@pytest.fixture
def cli_logging():
    configure_logging(verbose=False)
    yield
    logging.captureWarnings(False)


def test_an_evaluation_draws_a_bar_counting_its_questions_with_log_lines_whole_above_it(
    cli_logging: None, capsys: pytest.CaptureFixture
) -> None:
    with evaluation_progress():
        assert evaluate_echo(5, num_threads=2) == 100.0
    err = capsys.readouterr().err
    assert "questions answered" in err and "5/5" in err, err
    assert err.splitlines()[0] == "WARNING a step was retried"  # once: the four repeats are only counted


def test_no_bar_where_dspy_draws_its_own_or_outside_a_command(capsys: pytest.CaptureFixture) -> None:
    with evaluation_progress():
        evaluate_echo(2, display_progress=True)
    evaluate_echo(2)
    assert "questions answered" not in capsys.readouterr().err


def warn_and_score(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    """A metric that logs what dspy logs on every truncated LM call."""
    logging.getLogger("dspy.clients.base_lm").warning(TRUNCATED)
    return float(str(prediction.answer).strip() == example.answer)


def test_a_repeated_library_warning_is_printed_once_with_its_count(
    tmp_path: Path, capsys: pytest.CaptureFixture, one_torch_thread: None
) -> None:
    pytest.importorskip("peft")
    from conductor.cli import load_run_config
    from conductor.deploy import save_program
    from tests.cli.test_train_compile import write_config

    path = write_config(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["data"] |= {"metric": "tests.cli.test_progress:warn_and_score", "fractions": [0.5, 0.0, 0.5]}
    path.write_text(yaml.safe_dump(config))
    run = load_run_config(path)
    save_program(run.conductor(run.policy()), tmp_path / "program")
    try:
        assert main(["eval", str(tmp_path / "program"), "--config", str(path), "--trust-code", "-v"]) == 0
    finally:
        configure_logging(verbose=False)
        logging.captureWarnings(False)
    err = capsys.readouterr().err
    assert err.count(TRUNCATED) == 2, err  # shown once, then counted once at the end
    assert err.splitlines()[-1] == f"WARNING (3 times, shown once) {TRUNCATED}"
    assert "INFO " in err and "questions answered" in err  # -v adds the log; the bar stays


def test_the_cli_puts_its_once_only_filter_on_no_handler_of_the_root(cli_logging) -> None:
    # a library whose logger shares the root's handlers (as one did in the test suite): the filter would reach them,
    # and a test's log capture would miss every warning it had seen before
    root, dspy_logger = logging.getLogger(), logging.getLogger("dspy")
    capture, own = logging.Handler(), dspy_logger.handlers
    root.addHandler(capture)
    dspy_logger.handlers = root.handlers
    try:
        configure_logging(verbose=False)
        assert capture.filters == []
    finally:
        dspy_logger.handlers = own
        root.removeHandler(capture)
