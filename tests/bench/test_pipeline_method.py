"""The runner's ``pipeline`` method type: any fixed workflow, written step by step in the config."""

from __future__ import annotations

import pytest

from conductor.bench import MethodSpec
from conductor.errors import ConfigError
from conductor.modules import WorkerPool

POOL = WorkerPool.from_config(
    {
        "workers": [
            {"name": "calculator", "kind": "tool", "tool": "calculator"},
            {"name": "vote", "kind": "tool", "tool": "vote"},
        ]
    }
)


def _method(steps: list[dict]) -> MethodSpec:
    return MethodSpec.model_validate({"name": "p", "type": "pipeline", "args": {"steps": steps}})


def test_a_pipeline_runs_its_steps_with_their_access_lists() -> None:
    steps = [
        {"worker": 0, "subtask": "2+2", "access": []},
        {"worker": 0, "subtask": "1+3", "access": []},
        {"worker": 0, "subtask": "10-5", "access": []},
        {"worker": 1, "subtask": "Vote.", "access": [0, 1, 2]},
    ]
    prediction = _method(steps).build(POOL, 0)(question="Add.")
    assert prediction.response == "Answer: 4"
    assert [step.visible for step in prediction.trace] == [(), (), (), (0, 1, 2)]


def test_a_step_that_sees_a_later_step_is_refused() -> None:
    with pytest.raises(ConfigError, match="step 0"):
        _method([{"worker": 0, "subtask": "2+2", "access": [1]}, {"worker": 1, "subtask": "Vote."}]).build(POOL, 0)


def test_a_step_needs_a_subtask() -> None:
    with pytest.raises(ValueError, match="subtask"):
        _method([{"worker": 0}])
