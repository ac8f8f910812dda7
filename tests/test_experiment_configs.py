"""Every config under ``experiments/configs/`` still loads with today's library: a recipe that names a setting the
library dropped is a result no one can reproduce. (Bench configs may name saved programs that a clean clone lacks:
``best/`` folders are run outputs, not committed, and a bench keeps their recorded units without them.)"""

from pathlib import Path

import pytest
import yaml

from conductor.bench import load_config
from conductor.cli._config import load_run_config
from conductor.modules.pool import PoolSpec

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_experiment_config_loads(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    if "methods" in data:
        load_config(path)
    elif "output_dir" in data:
        load_run_config(path)
    else:
        assert "workers" in data, f"{path.name} is neither a bench, a compile nor a pool config"
        PoolSpec.model_validate(data)  # what the file says, not its workers (API keys, models) built


@pytest.mark.slow  # reads BIG-Bench-Hard and MMLU out of their wheels (downloaded once)
@pytest.mark.parametrize(("config", "questions"), [("default_train.yaml", 230), ("default_more_families.yaml", 278)])
def test_the_default_s_training_questions_hold_none_of_the_recovered_arithmetic_it_is_tested_on(
    config: str, questions: int
) -> None:
    from conductor.bench.datasets import load_mix

    folder = CONFIGS[0].parent
    data = yaml.safe_load((folder / config).read_text())["data"]
    asked = {example.question for example in load_mix(**data["args"])}
    recovered = [yaml.safe_load(line)["question"] for line in (folder / "bigbench_arithmetic_recovered.jsonl").open()]
    assert len(asked) == questions and not asked & set(recovered)
