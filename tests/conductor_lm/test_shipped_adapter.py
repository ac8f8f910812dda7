"""The shipped conductor's adapter is a standard peft folder: its base is the hub id of SmolLM2-135M-Instruct (not a
path of the machine that trained it), its model card says so, saving names an embedded base by its hub id, and
loading maps the hub id back to the embedded GGUF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

peft = pytest.importorskip("peft")
pytest.importorskip("torch")

from conductor.conductor_lm import ConductorLM  # noqa: E402
from conductor.deploy import TRAINED_PROGRAM  # noqa: E402
from conductor.local import DEFAULT_MODEL, EMBEDDED_MODELS  # noqa: E402

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ADAPTER = TRAINED_PROGRAM / "conductor_lm"


def test_the_shipped_adapter_names_its_base_by_hub_id() -> None:
    assert EMBEDDED_MODELS[DEFAULT_MODEL].hub_id == HUB_ID
    config = peft.PeftConfig.from_pretrained(str(ADAPTER))
    assert config.base_model_name_or_path == HUB_ID and config.peft_type == "LORA" and config.r == 8


def test_the_model_card_is_filled_in() -> None:
    card = (ADAPTER / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    metadata = yaml.safe_load(front)
    assert metadata["base_model"] == HUB_ID and metadata["library_name"] == "peft"
    assert f"base_model:adapter:{HUB_ID}" in metadata["tags"]
    assert "More Information Needed" not in body
    for section in ("## Training", "## Scores", "## Limits", "## Use"):
        assert section in body


def test_saving_over_an_embedded_base_writes_its_hub_id(tmp_path: Path, one_torch_thread: None) -> None:
    policy = ConductorLM.tiny()
    policy.base = DEFAULT_MODEL  # as if loaded from the embedded model: only the name matters to saving
    saved = policy.save(tmp_path / "policy")
    assert peft.PeftConfig.from_pretrained(str(saved)).base_model_name_or_path == HUB_ID
    assert json.loads((saved / "conductor_lm.json").read_text())["base"] == DEFAULT_MODEL


@pytest.mark.slow
def test_the_shipped_program_still_answers(capsys: pytest.CaptureFixture, one_torch_thread: None) -> None:
    from conductor.cli import main

    assert main(["run", "What is 17 * 23 + 4?"]) == 0
    assert "395" in capsys.readouterr().out


@pytest.mark.slow
def test_a_policy_whose_base_is_the_hub_id_loads_the_embedded_model(tmp_path: Path, one_torch_thread: None) -> None:
    folder = shutil.copytree(ADAPTER, tmp_path / "conductor_lm")
    config = json.loads((folder / "conductor_lm.json").read_text())
    (folder / "conductor_lm.json").write_text(json.dumps({**config, "base": HUB_ID}))
    policy = ConductorLM.load(folder, device="cpu")
    assert policy.base == DEFAULT_MODEL and policy.lora is not None and policy.lora.r == 8
