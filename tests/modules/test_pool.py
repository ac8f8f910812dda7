import pytest

from conductor import ConfigError
from conductor.modules import LMWorker, WorkerPool
from conductor.testing import ScriptedWorker

YAML = """
show_descriptions: true
workers:
  - {name: upper, kind: tool, tool: "string:capwords", description: capitalises words}
  - {name: calc, kind: tool, tool: calculator}
  - name: api
    kind: lm
    model: openai/gpt-4o-mini
    api_key_env: TEST_POOL_KEY
    price: {input_per_1k: 0.00015, output_per_1k: 0.0006}
"""

TOML = """
[[workers]]
name = "upper"
kind = "tool"
tool = "string:capwords"
"""


def test_pool_from_yaml_builds_each_kind_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_POOL_KEY", "sk-test")
    path = tmp_path / "pool.yaml"
    path.write_text(YAML)
    pool = WorkerPool.from_file(path)
    assert pool.names == ["upper", "calc", "api"]
    assert isinstance(pool[2], LMWorker) and pool[2].price.output_per_1k == 0.0006
    assert pool.describe().splitlines()[0] == "Model 0: capitalises words"
    assert pool[0].complete([{"role": "user", "content": "hello world"}], max_tokens=10, temperature=0).text == (
        "Hello World"
    )


def test_pool_from_toml(tmp_path):
    path = tmp_path / "pool.toml"
    path.write_text(TOML)
    pool = WorkerPool.from_file(path)
    assert pool.names == ["upper"] and pool.describe() == "Model 0"


def test_every_config_problem_is_reported_at_once():
    config = {
        "workers": [
            {"name": "a", "kind": "lm"},  # no model
            {"name": "a", "kind": "tool", "tool": "nope"},  # duplicate name (reported once the items are valid)
            {"name": "b", "kind": "robot"},
            {"name": "c", "kind": "tool", "tool": "calculator", "retries": -1, "colour": "red"},
        ]
    }
    with pytest.raises(ConfigError) as caught:
        WorkerPool.from_config(config)
    message = str(caught.value)
    for expected in (
        "workers.0",
        "needs `model`",
        "unknown tool 'nope'",
        "workers.2.kind",
        "workers.3.retries",
        "workers.3.colour",
    ):
        assert expected in message, message


def test_duplicate_names_are_refused():
    with pytest.raises(ConfigError, match="unique"):
        WorkerPool.from_config({"workers": [{"name": "x", "kind": "tool", "tool": "calculator"}] * 2})
    with pytest.raises(ConfigError, match="unique"):
        WorkerPool([ScriptedWorker("x"), ScriptedWorker("x")])


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    config = {"workers": [{"name": "api", "kind": "lm", "model": "openai/x", "api_key_env": "NOT_SET_KEY"}]}
    with pytest.raises(ConfigError, match=r"\$NOT_SET_KEY, which is not set"):
        WorkerPool.from_config(config)


@pytest.mark.parametrize("content, problem", [("workers: [", "not valid YAML"), ("- 1\n- 2", "must hold a mapping")])
def test_bad_files(tmp_path, content, problem):
    path = tmp_path / "pool.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=problem):
        WorkerPool.from_file(path)


def test_missing_file_and_unimportable_tool(tmp_path):
    with pytest.raises(ConfigError, match="can't read pool file"):
        WorkerPool.from_file(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="can't import tool"):
        WorkerPool.from_config({"workers": [{"name": "t", "kind": "tool", "tool": "no_such_module:f"}]})


def test_default_pool_needs_no_configuration():
    pool = WorkerPool.default()  # local models load lazily, so this is cheap
    assert pool.names == ["smollm2", "gemma", "python", "calculator"]
    assert pool.describe() == "Model 0\nModel 1\nModel 2\nModel 3"  # ids only, as in the paper
