import dataclasses
import json
import os

import dspy
import pytest

from conductor import ConductorError, ConfigError
from conductor.deploy import TRAINED_PROGRAM, _artifact, load, load_program, program_digest, save_program
from conductor.modules import Conductor, ConductorConfig, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.helpers import POOL_CONFIG, WORKFLOW, compiled_program, fixed_lm

QUESTION = "What is 17 * 23 + 4?"


def outputs(prediction: dspy.Prediction) -> dict:
    steps = [dataclasses.replace(step, latency_s=0.0) for step in prediction.trace]
    return {
        "answer": prediction.answer,
        "response": prediction.response,
        "workflow": prediction.workflow,
        "steps": steps,
        "cost": prediction.cost,
        "error": prediction.error,
    }


def folder_bytes(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_save_load_run_gives_the_same_outputs_as_the_original(tmp_path):
    original = compiled_program()
    expected = original(question=QUESTION)
    assert expected.answer == 395 and expected.error is None
    assert [step.role for step in expected.trace] == ["check", "solve"]

    folder = save_program(original, tmp_path / "program")
    loaded = load_program(folder, trust_code=True)
    got = loaded(question=QUESTION)

    assert outputs(got) == outputs(expected)
    assert loaded.orchestrate.lm.engine.prompts == original.orchestrate.lm.engine.prompts  # same conductor prompt
    assert loaded.dump_state() == original.dump_state()  # instructions, demos and LMs of every predictor
    assert loaded.signature.output_fields["answer"].annotation is int
    assert list(loaded.roles) == ["solve", "check"] and loaded.executor.default_role == "solve"
    assert loaded.executor.budget == original.executor.budget and loaded.limits == original.limits
    assert loaded.fallback == "none" and loaded.pool.names == original.pool.names
    assert load is load_program


def test_the_manifest_describes_the_program(tmp_path):
    pareto = {"accuracy": 0.9, "cost": 0.01}
    folder = save_program(compiled_program(), tmp_path / "p", extra_manifest={"pareto_point": pareto})
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == _artifact.FORMAT_VERSION
    assert {"dspy-conductor", "dspy", "litellm", "python"} <= set(manifest["versions"])
    assert manifest["conductor_lm"]["model"] == "scripted/fixed"
    assert manifest["signature"] == "question: str -> answer: int"
    assert manifest["max_steps"] == 3 and manifest["budget"]["max_tokens"] == 5_000
    assert manifest["pareto_point"] == pareto
    solve, check = manifest["roles"]
    assert solve["class"] == "conductor.signatures._roles:Solve" and solve["instructions"].startswith("Solve it")
    assert check == {
        "name": "check",
        "class": None,
        "signature": "question: str, subtask: str -> verdict: str",
        "instructions": "Restate the task in one line.",
    }
    assert json.loads((folder / "pool.json").read_text())["workers"][0]["tool"] == "string:capwords"


def test_no_secret_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("POOL_WORKER_KEY", "sk-pool-SECRET-1")
    pool_config = POOL_CONFIG | {
        "workers": [
            *POOL_CONFIG["workers"],
            {"name": "gpt", "kind": "lm", "model": "openai/x", "api_key_env": "POOL_WORKER_KEY"},
        ]
    }
    pool = WorkerPool.from_config(pool_config)
    assert pool[2].lm.kwargs["api_key"] == "sk-pool-SECRET-1"
    lm = dspy.LM("openai/gpt-4o-mini", api_key="sk-conductor-SECRET-2", extra_headers={"X-Key": "SECRET-3"})
    folder = save_program(Conductor(pool, lm), tmp_path / "p")

    for name, data in folder_bytes(folder).items():
        for secret in (b"SECRET-1", b"SECRET-2", b"SECRET-3"):
            assert secret not in data, f"{secret!r} written to {name}"
    assert lm.kwargs["api_key"] == "sk-conductor-SECRET-2"  # the program itself is untouched

    loaded = load_program(folder, trust_code=True)  # the key is read from the environment again
    assert loaded.pool[2].lm.kwargs["api_key"] == "sk-pool-SECRET-1"
    assert loaded.orchestrate.lm.model == "openai/gpt-4o-mini" and "api_key" not in loaded.orchestrate.lm.kwargs
    monkeypatch.delenv("POOL_WORKER_KEY")
    with pytest.raises(ConfigError, match=r"\$POOL_WORKER_KEY, which is not set"):
        load_program(folder, trust_code=True)


@pytest.mark.parametrize("fail_in", ["program.json", "manifest.json"])
def test_a_save_that_fails_midway_leaves_the_earlier_program_and_no_temporary_folder(tmp_path, monkeypatch, fail_in):
    program = compiled_program()
    folder = save_program(program, tmp_path / "p")
    before = folder_bytes(folder)

    def broken_save(self, path, *args, **kwargs):
        raise OSError("disk full")

    def broken_write(path, data):
        if path.name == fail_in:
            raise OSError("disk full")
        (path).write_text(json.dumps(data))

    if fail_in == "program.json":
        monkeypatch.setattr(dspy.Module, "save", broken_save)
    else:
        monkeypatch.setattr(_artifact, "_write_json", broken_write)
    other = compiled_program(lm=fixed_lm("something else"))
    with pytest.raises(OSError, match="disk full"):
        save_program(other, folder)

    assert folder_bytes(folder) == before
    assert os.listdir(tmp_path) == ["p"]
    assert other.orchestrate.lm is not None  # the LMs set aside for DSPy's save are back


def test_saving_again_replaces_the_program(tmp_path):
    folder = save_program(compiled_program(), tmp_path / "p")
    save_program(compiled_program(lm=fixed_lm("other")), folder)
    assert load_program(folder, trust_code=True).orchestrate.lm.engine.text == "other"
    assert os.listdir(tmp_path) == ["p"]


def test_a_folder_that_is_not_a_saved_program_is_never_overwritten(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("keep me")
    with pytest.raises(ConductorError, match=r"holds no manifest\.json"):
        save_program(compiled_program(), tmp_path / "data")
    assert (tmp_path / "data" / "notes.txt").read_text() == "keep me"


def test_a_pool_built_in_code_cant_be_saved(tmp_path):
    program = Conductor(WorkerPool([ScriptedWorker("w")]), fixed_lm())
    with pytest.raises(ConfigError, match=r"build it with WorkerPool\.from_config"):
        save_program(program, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_a_conductor_lm_that_cant_be_saved_is_named(tmp_path):
    program = Conductor(WorkerPool.from_config(POOL_CONFIG), scripted_lm([WORKFLOW]))
    with pytest.raises(ConfigError, match="'scripted/conductor' can't be saved"):
        save_program(program, tmp_path / "p")


def test_extra_manifest_cant_replace_the_manifest_s_own_entries(tmp_path):
    with pytest.raises(ConfigError, match="budget"):
        save_program(compiled_program(), tmp_path / "p", extra_manifest={"budget": {}})


@pytest.mark.parametrize("name", ["manifest.json", "pool.json", "program.json"])
def test_a_missing_file_is_named(tmp_path, name):
    folder = save_program(compiled_program(), tmp_path / "p")
    (folder / name).unlink()
    with pytest.raises(ConductorError, match=rf"{name} is missing"):
        load_program(folder, trust_code=True)


def test_a_compile_output_folder_points_to_the_program_inside(tmp_path):
    save_program(compiled_program(), tmp_path / "run" / "best")
    with pytest.raises(ConductorError, match=r"a run's output folder, not a saved program; load .*run/best$"):
        load_program(tmp_path / "run", trust_code=True)


def test_a_manifest_of_another_format_version_is_refused(tmp_path):
    folder = save_program(compiled_program(), tmp_path / "p")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(manifest | {"format_version": 99}))
    with pytest.raises(ConductorError, match="version 99"):
        load_program(folder, trust_code=True)


def test_a_broken_program_json_is_named(tmp_path):
    folder = save_program(compiled_program(), tmp_path / "p")
    (folder / "program.json").write_text("{not json")
    with pytest.raises(ConductorError, match=r"program\.json can't be loaded"):
        load_program(folder, trust_code=True)


def test_a_trainable_conductor_lm_is_saved_in_its_own_folder(tmp_path):
    pytest.importorskip("peft")
    from conductor.conductor_lm import ConductorLM

    policy = ConductorLM.tiny(seed=0)
    original = compiled_program(lm=policy.as_dspy_lm(max_tokens=24))
    original.fallback = "first_worker"  # the random tiny model writes no workflow: worker 0 answers
    expected = original(question=QUESTION)

    folder = save_program(original, tmp_path / "p")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["conductor_lm"]["folder"] == "conductor_lm/" and (folder / "conductor_lm").is_dir()
    assert policy.saved_to == folder / "conductor_lm"
    loaded = load_program(folder, trust_code=True)
    got = loaded(question=QUESTION)
    assert outputs(got) == outputs(expected) and got.conductor_text == expected.conductor_text

    (folder / "conductor_lm" / "adapter_model.safetensors").unlink()
    with pytest.raises(ConductorError, match=r"adapter_model\.safetensors is missing"):
        load_program(folder, trust_code=True)


def test_conductor_save_writes_a_folder_and_conductor_load_reads_it(tmp_path):
    import conductor

    program = compiled_program()
    conductor.save(program, tmp_path / "deployed", extra_manifest={"pareto_point": {"max_cost": 0.01}})
    loaded = conductor.load(tmp_path / "deployed", trust_code=True)
    assert isinstance(loaded, conductor.Conductor)
    assert json.loads((tmp_path / "deployed" / "manifest.json").read_text())["pareto_point"] == {"max_cost": 0.01}


def test_the_programs_own_save_is_dspys_and_refuses_a_folder_without_save_program(tmp_path):
    program = compiled_program()
    program.save(tmp_path / "state.json")  # the predictors' state, as DSPy saves it
    assert "orchestrate" in json.loads((tmp_path / "state.json").read_text())
    with pytest.raises(ConductorError, match=r"conductor\.save\(program, path\)"):
        program.save(tmp_path / "deployed")
    assert not (tmp_path / "deployed").exists()
    program.save(tmp_path / "whole", save_program=True)  # DSPy's own whole-program folder (cloudpickle)
    assert dspy.load(str(tmp_path / "whole"), allow_pickle=True)(question=QUESTION).answer == 395


def test_the_manifest_holds_the_programs_config_and_rebuilds_it(tmp_path):
    original = compiled_program()
    folder = save_program(original, tmp_path / "p")
    manifest = json.loads((folder / "manifest.json").read_text())
    config = original.config().model_dump(mode="json")
    assert {k: manifest[k] for k in ConductorConfig.model_fields} == config
    assert load_program(folder, trust_code=True).config().model_dump(mode="json") == config
    rebuilt = Conductor.from_config(original.config(), original.pool, original.orchestrate.lm)
    assert rebuilt.config().model_dump(mode="json") == config


def test_a_manifest_without_the_newer_options_loads_with_their_defaults(tmp_path):
    folder = save_program(compiled_program(), tmp_path / "p")
    manifest = json.loads((folder / "manifest.json").read_text())
    for newer in ("max_depth", "max_parallel"):  # written since format version 1 began
        del manifest[newer]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    loaded = load_program(folder, trust_code=True)
    assert loaded.max_depth == 0 and loaded.executor.max_parallel == 4


def test_the_shipped_programs_options_read_back_as_written():
    manifest = json.loads((TRAINED_PROGRAM / "manifest.json").read_text())
    config = _artifact._read_config(TRAINED_PROGRAM / "manifest.json", manifest)
    dumped = config.model_dump(mode="json")
    assert dumped == {**dumped, **{k: manifest[k] for k in dumped if k in manifest}}
    assert config.max_steps == 1 and [role.__name__ for role in config.roles][:2] == ["Solve", "Plan"]
    assert "worker_ids" not in manifest and config.worker_ids == "numbers"  # saved before names: as it was trained


def test_invalid_options_in_a_manifest_are_a_clear_error(tmp_path):
    folder = save_program(compiled_program(), tmp_path / "p")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "fallback": "guess", "max_steps": 0}))
    with pytest.raises(ConductorError, match=r"invalid program options: max_steps: .*; fallback: "):
        load_program(folder, trust_code=True)


def test_a_program_that_names_its_workers_loads_naming_them(tmp_path):
    program = compiled_program()
    program.worker_ids = "names"
    loaded = load_program(save_program(program, tmp_path / "p"), trust_code=True)
    assert loaded.worker_ids == "names"
    assert '"names"' in (tmp_path / "p" / "manifest.json").read_text()
    assert 'model_id = ["' in loaded.prompt_messages("1 + 1")[2]["content"]  # the demo, by name


def test_a_programs_digest_is_its_content_less_the_time_it_was_saved(tmp_path):
    pool = WorkerPool.from_config(POOL_CONFIG)
    save_program(Conductor(pool, fixed_lm(WORKFLOW)), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    save_program(Conductor(pool, fixed_lm(WORKFLOW)), tmp_path / "b")
    (tmp_path / "b" / "manifest.json").write_text(json.dumps({**manifest, "created": "2020-01-01T00:00:00+00:00"}))
    assert program_digest(tmp_path / "a") == program_digest(tmp_path / "b")
    save_program(Conductor(pool, fixed_lm(WORKFLOW), max_steps=1), tmp_path / "c")
    assert program_digest(tmp_path / "c") != program_digest(tmp_path / "a")
    for odd in ("[1, 2]", '{"no": "time"}', "not json"):  # any folder: a manifest.json of another kind counts as bytes
        (tmp_path / "d").mkdir(exist_ok=True)
        (tmp_path / "d" / "manifest.json").write_text(odd)
        assert len(program_digest(tmp_path / "d")) == 64
