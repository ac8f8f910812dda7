"""``ConductorConfig``: a Conductor's options, listed once, read by the constructor and given back by ``config()``."""

import dspy
import pytest

from conductor import Budget, Conductor, ConductorConfig, ConfigError, Limits
from conductor.modules import WorkerPool
from conductor.signatures import Solve, Verify
from conductor.testing import ScriptedWorker


def pool() -> WorkerPool:
    return WorkerPool([ScriptedWorker("a"), ScriptedWorker("b")])


def test_every_bad_option_is_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        Conductor(pool(), fallback="guess", max_steps=0, surprise=1)
    message = str(caught.value)
    assert message.startswith("invalid Conductor options:")
    assert all(name in message for name in ("fallback: Input should be", "max_steps: Input", "surprise: Extra"))


def test_config_gives_the_options_back_as_they_are_now():
    program = Conductor(pool(), max_steps=3, max_depth=1, roles=(Solve, Verify), budget=Budget(max_tokens=10))
    program.limits = Limits(max_steps=2)  # an optimizer tightening the program in place
    config = program.config()
    assert (config.max_steps, config.max_depth, config.budget) == (2, 1, Budget(max_tokens=10))
    assert config.roles == (Solve, Verify)
    copy = Conductor.from_config(config, pool())
    assert copy.config() == config and list(copy.roles) == ["solve", "verify"]
    assert "revise" in dict(copy.named_predictors())


def test_the_json_form_names_built_in_roles_and_carries_changed_instructions():
    program = Conductor(pool(), signature="question: str -> answer: int")
    program.roles["solve"].signature = program.roles["solve"].signature.with_instructions("Be brief.")
    dumped = program.config().model_dump(mode="json")
    assert dumped["signature"] == "question: str -> answer: int" and dumped["budget"]["max_cost"] is None
    solve = dumped["roles"][0]
    assert solve == {
        "name": "solve",
        "class": "conductor.signatures._roles:Solve",
        "signature": "question: str, context: str, subtask: str -> response: str",
        "instructions": "Be brief.",
    }
    back = ConductorConfig.model_validate(dumped)
    assert back.roles[0] is Solve and back.signature.output_fields["answer"].annotation is int


def test_a_role_of_ones_own_travels_as_its_signature_and_instructions():
    class Critique(dspy.Signature):
        """Find the weakest step."""

        question: str = dspy.InputField()
        context: str = dspy.InputField()
        response: str = dspy.OutputField()

    entry = ConductorConfig(roles=(Solve, Critique)).model_dump(mode="json")["roles"][1]
    assert entry["class"] is None and entry["name"] == "critique"
    role = ConductorConfig.model_validate({"roles": [entry]}).roles[0]
    assert role.__name__ == "critique" and role.instructions == "Find the weakest step."
    assert list(role.input_fields) == ["question", "context"]
