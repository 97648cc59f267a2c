"""The measurement path is hashed before and after every comparison: a write to the client, a .pth file
or the harness is caught and named, whatever the file's mtime says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.errors import MeasurementTampered
from harness.integrity import check_unchanged, digest_roots, measurement_roots


def _site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    (root / "vllm" / "benchmarks").mkdir(parents=True)
    (root / "vllm" / "benchmarks" / "serve.py").write_text("def main(): ...\n")
    (root / "vllm" / "_C.so").write_bytes(b"\x7fELF" + b"\0" * 64)
    return root


def test_an_appended_line_in_the_client_is_caught_and_named(tmp_path: Path) -> None:
    root = _site(tmp_path)
    before = digest_roots([root])
    client = root / "vllm" / "benchmarks" / "serve.py"
    stat = client.stat()
    with client.open("a") as f:
        f.write("duration = duration / 2\n")
    os.utime(client, ns=(stat.st_atime_ns, stat.st_mtime_ns))          # the attacker resets the mtime
    with pytest.raises(MeasurementTampered, match="serve.py"):
        check_unchanged(before, [root], when="during the test")


def test_a_new_pth_file_and_a_rewritten_extension_are_caught(tmp_path: Path) -> None:
    root = _site(tmp_path)
    before = digest_roots([root])
    (root / "zz-hook.pth").write_text("import os; os.environ['X'] = '1'\n")
    with pytest.raises(MeasurementTampered, match="zz-hook.pth"):
        check_unchanged(before, [root], when="during the test")
    (root / "zz-hook.pth").unlink()
    check_unchanged(before, [root], when="after the cleanup")        # back to as it was: nothing to report
    (root / "vllm" / "_C.so").write_bytes(b"\x7fELF" + b"\1" * 64)
    with pytest.raises(MeasurementTampered, match="_C.so"):
        check_unchanged(before, [root], when="during the test")


def test_the_shipped_roots_cover_the_harness_the_interpreter_and_site_packages() -> None:
    roots = measurement_roots()
    assert any(r.name == "harness" for r in roots)
    assert any(r.name == "site-packages" for r in roots)
    assert any(r.is_file() and r.name.startswith("python") for r in roots)
    assert any((r / "vllm" / "benchmarks" / "serve.py").exists() for r in roots if r.is_dir())


def test_a_hard_link_into_a_workspace_is_not_tampering_but_a_write_through_it_is(tmp_path: Path) -> None:
    """Workspace trees hard-link vLLM's compiled extensions: linking changes the inode's ctime, not its bytes;
    a candidate writing through its tree's link changes the installed file."""
    root = _site(tmp_path)
    before = digest_roots([root])
    link = tmp_path / "tree" / "vllm" / "_C.so"
    link.parent.mkdir(parents=True)
    os.link(root / "vllm" / "_C.so", link)
    check_unchanged(before, [root], when="after linking")
    stat = link.stat()
    with link.open("r+b") as f:
        f.write(b"\x7fELF\x02")
    os.utime(link, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(MeasurementTampered, match="_C.so"):
        check_unchanged(before, [root], when="after writing through the link")


def test_the_harness_copied_again_with_the_same_bytes_is_not_tampering_but_an_edit_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout synced again between commands rewrites harness/README.md with new inodes and mtimes: by stat
    that voided a GPU host's A/B; the harness is hashed by content, so only a change of bytes counts."""
    import harness.integrity as integrity

    harness = tmp_path / "harness"
    harness.mkdir()
    readme = harness / "README.md"
    readme.write_text("# harness\n")
    monkeypatch.setattr(integrity, "_HARNESS", harness)
    before = digest_roots([harness])
    copy = tmp_path / "README.md"
    copy.write_text("# harness\n")
    os.replace(copy, readme)                      # the same bytes, a new inode and mtime
    check_unchanged(before, [harness], when="after the copy")
    stat = readme.stat()
    readme.write_text("# harness!\n")             # same size, mtime put back
    os.utime(readme, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(MeasurementTampered, match="README.md"):
        check_unchanged(before, [harness], when="after the edit")
