"""``ReplayWorker``: a prompt seen before gets the completion it got, so methods of one experiment share samples."""

from __future__ import annotations

import pytest

from conductor.errors import ConfigError, WorkerError
from conductor.modules import WorkerPool
from conductor.modules.workers import ReplayStore, ReplayWorker
from conductor.testing import ScriptedWorker


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_repeated_prompt_is_answered_once() -> None:
    inner = ScriptedWorker("model", ["first", "second", "third"], description="a model", max_tokens=7)
    worker = ReplayWorker(inner)
    assert (worker.name, worker.description, worker.max_tokens) == ("model", "a model", 7)
    assert worker.complete(_user("q"), max_tokens=5, temperature=0.2).text == "first"
    assert worker.complete(_user("q"), max_tokens=5, temperature=0.2).text == "first"
    assert worker.complete(_user("q"), max_tokens=6, temperature=0.2).text == "second"  # another request
    assert worker.complete(_user("other"), max_tokens=5, temperature=0.2).text == "third"
    assert inner.calls == 3


def test_a_failed_call_is_not_kept() -> None:
    inner = ScriptedWorker("model", lambda prompt: "ok", fail_times=1)
    worker = ReplayWorker(inner)
    with pytest.raises(WorkerError):
        worker.complete(_user("q"), max_tokens=5, temperature=0.0)
    assert worker.complete(_user("q"), max_tokens=5, temperature=0.0).text == "ok"
    assert inner.calls == 2


def test_pool_configs_opt_in_per_worker() -> None:
    pool = WorkerPool.from_config(
        {
            "workers": [
                {"name": "c", "kind": "tool", "tool": "calculator", "replay": True},
                {"name": "v", "kind": "tool", "tool": "vote"},
            ]
        }
    )
    assert isinstance(pool[0], ReplayWorker) and not isinstance(pool[1], ReplayWorker)
    assert pool[0].complete(_user("2+3"), max_tokens=10, temperature=0.0).text == "5"


def test_the_same_prompt_sent_at_once_is_one_call_and_the_calls_are_counted() -> None:
    from concurrent.futures import ThreadPoolExecutor

    inner = ScriptedWorker("model", lambda prompt: f"answer to {prompt}", delay_s=0.2)
    worker = ReplayWorker(inner)
    with ThreadPoolExecutor(8) as threads:
        answers = list(
            threads.map(lambda i: worker.complete(_user(f"q{i % 2}"), max_tokens=5, temperature=0.2), range(8))
        )
    assert {a.text for a in answers} == {"answer to q0", "answer to q1"}
    assert inner.calls == worker.calls == 2  # the six others waited for their prompt's first call
    assert worker.tokens == 2 * (1 + 3)  # word counts: one prompt word, three answer words, twice


def test_a_failed_call_counts_as_a_call() -> None:
    worker = ReplayWorker(ScriptedWorker("model", lambda prompt: "ok", fail_times=1))
    with pytest.raises(WorkerError):
        worker.complete(_user("q"), max_tokens=5, temperature=0.2)
    worker.complete(_user("q"), max_tokens=5, temperature=0.2)
    assert (worker.calls, worker.tokens) == (2, 2)


def test_a_replayed_pool_shows_the_conductor_what_the_pool_shows() -> None:
    # program search and the compiler's paired scoring run programs over it: a pool that hid descriptions (or
    # dropped fallbacks) would change the conductor's prompt and what a failed worker falls back to
    counter = iter(range(100))
    pool = WorkerPool(
        [ScriptedWorker("a", lambda _: str(next(counter))), ScriptedWorker("b", lambda _: "b")],
        show_descriptions=False,
        fallbacks={"a": ["b"]},
    )
    replay = pool.replayed()
    assert replay.names == ["a", "b"] and all(isinstance(w, ReplayWorker) for w in replay)
    assert replay.show_descriptions is False and replay.fallbacks == pool.fallbacks == {"a": ("b",)}
    messages = [{"role": "user", "content": "q"}]
    first, again = (replay[0].complete(messages, max_tokens=8, temperature=1.0).text for _ in range(2))
    assert first == again == "0"


# --- ReplayStore: completions kept on disk, shared by processes and runs -------------------------------------------


def test_a_store_answers_a_new_worker_with_the_completion_another_one_got(tmp_path) -> None:
    store = ReplayStore(tmp_path / "replay.sqlite")
    first = ReplayWorker(ScriptedWorker("model", ["first", "second"]), store)
    assert first.complete(_user("q"), max_tokens=5, temperature=0.2).text == "first"
    later_run = ScriptedWorker("model", ["other"])
    again = ReplayWorker(later_run, ReplayStore(tmp_path / "replay.sqlite"))
    answer = again.complete(_user("q"), max_tokens=5, temperature=0.2)
    assert (answer.text, answer.input_tokens, answer.output_tokens) == ("first", 1, 1)
    assert later_run.calls == again.calls == again.tokens == 0  # nothing was asked of the model
    assert again.complete(_user("new"), max_tokens=5, temperature=0.2).text == "other"
    assert len(store) == 2


def test_a_store_keys_calls_by_worker_name(tmp_path) -> None:
    store = ReplayStore(tmp_path / "replay.sqlite")
    ReplayWorker(ScriptedWorker("a", ["from a"]), store).complete(_user("q"), max_tokens=5, temperature=0.2)
    b = ReplayWorker(ScriptedWorker("b", ["from b"]), store)
    assert b.complete(_user("q"), max_tokens=5, temperature=0.2).text == "from b"


def _race(path: str, name: str, start: float) -> str:
    """One process's call to a store that another process calls at the same moment (for the race below)."""
    import time

    time.sleep(max(0.0, start - time.time()))
    worker = ReplayWorker(ScriptedWorker("model", [name], delay_s=0.1), ReplayStore(path))
    return worker.complete(_user("q"), max_tokens=5, temperature=0.2).text


def test_processes_racing_on_one_call_all_get_the_first_completion_stored(tmp_path) -> None:
    import multiprocessing
    import time

    path = str(tmp_path / "replay.sqlite")
    ReplayStore(path)
    start = time.time() + 1.0
    with multiprocessing.get_context("spawn").Pool(4) as processes:
        answers = processes.starmap(_race, [(path, f"process {i}", start) for i in range(4)])
    assert len(set(answers)) == 1 and answers[0].startswith("process ")  # four models ran, one answer stands
    assert len(ReplayStore(path)) == 1


def test_a_store_that_cannot_be_opened_is_a_config_error(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"can.t use .* as a replay store"):
        ReplayStore(tmp_path / "file" / "replay.sqlite")
    (tmp_path / "garbage.sqlite").write_bytes(b"not a database" * 100)
    with pytest.raises(ConfigError, match="replay store"):
        ReplayStore(tmp_path / "garbage.sqlite")


def test_a_pool_file_builds_its_replay_workers_on_the_store(tmp_path) -> None:
    (tmp_path / "pool.yaml").write_text("workers:\n  - {name: c, kind: tool, tool: calculator, replay: true}\n")
    store = ReplayStore(tmp_path / "replay.sqlite")
    pool = WorkerPool.from_file(tmp_path / "pool.yaml", replay_store=store)
    assert pool[0].store is store
    pool[0].complete(_user("2+3"), max_tokens=10, temperature=0.0)
    assert len(store) == 1


def test_a_pool_names_the_one_store_its_replay_workers_keep_completions_in(tmp_path) -> None:
    one, other = ReplayStore(tmp_path / "one.sqlite"), ReplayStore(tmp_path / "other.sqlite")
    plain = ScriptedWorker("plain", ["a"])
    assert WorkerPool([plain, ReplayWorker(ScriptedWorker("m", ["b"]))]).replay_store is None  # kept in memory
    assert WorkerPool([plain, ReplayWorker(ScriptedWorker("m", ["b"]), one)]).replay_store is one
    mixed = WorkerPool([ReplayWorker(ScriptedWorker("m", ["b"]), one), ReplayWorker(ScriptedWorker("n", ["c"]), other)])
    with pytest.raises(ConfigError, match="in 2 stores: use one"):
        _ = mixed.replay_store
