from pathlib import Path

import pytest

from conductor._files import cache_dir, write_folder_atomically


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CONDUCTOR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "dspy-conductor"
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path / "own"))
    assert cache_dir("models", "m") == tmp_path / "own" / "models" / "m"


def failing(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"half")
    raise OSError("disk full")


def test_a_failed_write_leaves_no_partial_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with pytest.raises(OSError, match="disk full"):
        write_folder_atomically(target, failing)
    assert list(target.parent.iterdir()) == []
    write_folder_atomically(target, lambda folder: (folder / "config.json").write_text("{}"))
    assert [p.name for p in target.parent.iterdir()] == ["m"]
    assert (target / "config.json").read_text() == "{}"


def test_a_folder_another_process_finished_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("first")
    write_folder_atomically(target, lambda folder: (folder / "config.json").write_text("second"))
    assert (target / "config.json").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_replace_swaps_in_the_new_folder_only_when_it_is_complete(tmp_path: Path) -> None:
    target = tmp_path / "program"
    write_folder_atomically(target, lambda folder: (folder / "v").write_text("1"))
    with pytest.raises(OSError):
        write_folder_atomically(target, failing, replace=True)
    assert (target / "v").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["program"]
    write_folder_atomically(target, lambda folder: (folder / "v").write_text("2"), replace=True)
    assert (target / "v").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["program"]
