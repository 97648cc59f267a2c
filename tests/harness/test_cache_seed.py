"""A candidate that changes engine args alone runs the incumbent's code: its cache folder starts as a copy of the
incumbent's. Never across code, never over a folder that exists, never the incumbent's own."""

from __future__ import annotations

from pathlib import Path

from harness.measure import Build, seed_cache
from sandbox.workspace import SERVING_FILE, Workspace


def _build(tag: str, code: str) -> Build:
    return Build(tag=tag, tree=Path("/nonexistent"), engine_args={}, cache_key=f"content-{tag}", code_key=code)


def _warm(folder: Path) -> Path:
    (folder / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (folder / "vllm" / "torch_compile_cache" / "graph.bin").write_bytes(b"compiled")
    return folder


def test_a_candidate_with_the_incumbents_code_starts_from_a_copy_of_its_caches(tmp_path: Path) -> None:
    a, b = _build("A", "code-1"), _build("B", "code-1")
    source = _warm(tmp_path / "content-A")
    assert seed_cache(a, source, b, tmp_path / "content-B")
    assert (tmp_path / "content-B" / "vllm" / "torch_compile_cache" / "graph.bin").read_bytes() == b"compiled"
    # a copy, not a share: what B's server writes stays out of A's folder
    (tmp_path / "content-B" / "vllm" / "torch_compile_cache" / "graph.bin").write_bytes(b"B's own")
    assert (source / "vllm" / "torch_compile_cache" / "graph.bin").read_bytes() == b"compiled"


def test_no_copy_across_code_over_an_existing_folder_or_from_nothing(tmp_path: Path) -> None:
    a = _build("A", "code-1")
    source = _warm(tmp_path / "content-A")
    assert not seed_cache(a, source, _build("B", "code-2"), tmp_path / "other-code")       # another code
    assert not seed_cache(a, source, _build("B", ""), tmp_path / "unknown-code")          # code not known
    assert not seed_cache(_build("A", ""), source, _build("B", ""), tmp_path / "neither")
    (tmp_path / "own").mkdir()
    assert not seed_cache(a, source, _build("B", "code-1"), tmp_path / "own")             # its own already
    assert not any((tmp_path / "own").iterdir())
    assert not seed_cache(a, tmp_path / "cold-A", _build("B", "code-1"), tmp_path / "x")   # nothing to copy
    assert not seed_cache(a, source, a, source)                                           # the incumbent itself
    (tmp_path / "docker-A" / "vllm").mkdir(parents=True)          # folders, no file: the caches stayed in a tmpfs
    assert not seed_cache(a, tmp_path / "docker-A", _build("B", "code-1"), tmp_path / "y")
    assert not any((tmp_path / name).exists() for name in ("other-code", "unknown-code", "neither", "x", "y"))


def test_the_code_hash_ignores_serving_yaml_and_nothing_else(tmp_path: Path) -> None:
    src = tmp_path / "src" / "vllm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "model.py").write_text("SCALE = 1.0\n")
    ws = Workspace.create(tmp_path / "ws", source=src, serving={"max_num_seqs": 4})
    base = ws.code_hash("HEAD")
    assert ws.code_hash() == base                                 # the working tree as committed
    (ws.root / SERVING_FILE).write_text("max_num_seqs: 8\n")
    assert ws.code_hash() == base and ws.content_hash() != ws.tree_hash("HEAD")   # engine args alone
    (ws.root / "vllm" / "model.py").write_text("SCALE = 1.1\n")
    assert ws.code_hash() != base                                 # the code
    assert ws.code_hash("HEAD") == base                           # a commit's tree is read as it is
