"""One way to name a conductor LM (``conductor.deploy.conductor_lm``): tiny, local/<name>, a saved folder, litellm."""

import dspy
import pytest

from conductor.deploy import conductor_lm, conductor_policy, is_trainable
from conductor.errors import ConfigError


def test_a_litellm_string_is_an_api_model_and_not_trainable():
    lm = conductor_lm("openai/gpt-4o-mini", max_tokens=99, temperature=0.5)
    assert type(lm) is dspy.LM and lm.model == "openai/gpt-4o-mini"
    assert lm.kwargs["max_tokens"] == 99 and lm.kwargs["temperature"] == 0.5 and not lm.cache
    assert not is_trainable("openai/gpt-4o-mini")
    with pytest.raises(ConfigError, match="not a trainable model: name tiny, local/<name> or a model folder"):
        conductor_policy("openai/gpt-4o-mini")


def test_tiny_local_names_and_folders_are_trainable(tmp_path):
    assert is_trainable("tiny") and is_trainable("local/smollm2-135m-instruct") and is_trainable(str(tmp_path))


def test_a_saved_policy_folder_loads_with_its_own_adapter(tmp_path):
    pytest.importorskip("peft")
    from conductor.conductor_lm import ConductorLM, LoraSpec

    saved = ConductorLM.tiny(seed=3, lora=LoraSpec(r=2, alpha=4)).save(tmp_path / "policy")
    policy = conductor_policy(str(saved), lora=LoraSpec(r=8, alpha=16))  # the saved adapter, not this one
    assert (policy.lora.r, policy.lora.alpha) == (2, 4)
    lm = conductor_lm(str(saved), max_tokens=7)
    assert lm.kwargs["max_tokens"] == 7
    assert conductor_policy("tiny", lora=None).lora is None
