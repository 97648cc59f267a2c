"""Which compile-cache folder a server gets: one per build content, never one shared by two live servers."""

from __future__ import annotations

from pathlib import Path

from harness.measure import Build, cache_dir_for


def _build(tag: str, key: str = "") -> Build:
    return Build(tag=tag, tree=Path("/t") / tag, engine_args={}, cache_key=key)


def test_same_content_same_folder_other_content_other_folder(tmp_path: Path) -> None:
    assert cache_dir_for(_build("A", "abc"), tmp_path) == cache_dir_for(_build("baseline", "abc"), tmp_path)
    assert cache_dir_for(_build("A", "abc"), tmp_path) != cache_dir_for(_build("B", "def"), tmp_path)


def test_two_live_servers_of_one_content_get_two_folders(tmp_path: Path) -> None:
    a = cache_dir_for(_build("A", "abc"), tmp_path)
    b = cache_dir_for(_build("B", "abc"), tmp_path, taken=(a,))
    assert a == tmp_path / "abc" and b == tmp_path / "abc-B"


def test_a_build_without_a_key_has_a_folder_per_tag(tmp_path: Path) -> None:
    assert cache_dir_for(_build("A"), tmp_path) == tmp_path / "A"
    assert cache_dir_for(_build("B"), tmp_path) == tmp_path / "B"
