"""sandbox/bundle.py and bundle_build.py: the resolver, file dropping, packing, chunking and the stdlib-only installer,
on small wheels built here (no network: `fetch` only copies from a local folder)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.cli import main as ratchet
from sandbox.bundle import MANIFEST, BundleError, install, reassemble
from sandbox.bundle_build import HostPackages, Target, build, drop_files, resolve

PY312 = Target(python="3.12", platforms=("manylinux_2_28_x86_64",))


def make_wheel(folder: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
               files: dict[str, bytes] | None = None, tag: str = "py3-none-any") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    dist = f"{name}-{version}.dist-info"
    files = dict(files or {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode()})
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *(f"Requires-Dist: {r}" for r in requires)]) + "\n\n"
    files[f"{dist}/METADATA"] = meta.encode()
    files[f"{dist}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for n, data in files.items():
            zf.writestr(n, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def local_fetch(index: Path, calls: list[str] | None = None):  # type: ignore[no-untyped-def]
    """A fetch that copies the newest matching wheel from `index` (a stand-in for pip download)."""
    from sandbox.bundle_build import _matching

    def fetch(requirement: str, dest: Path) -> Path:
        if calls is not None:
            calls.append(requirement)
        found = _matching(index, requirement)
        if not found:
            raise BundleError(f"no wheel for {requirement}")
        src = max(found, key=lambda p: p.name)
        (dest / src.name).write_bytes(src.read_bytes())
        return dest / src.name

    return fetch


@pytest.fixture
def index(tmp_path: Path) -> Path:
    idx = tmp_path / "index"
    make_wheel(idx, "app", "1.0", requires=(
        "newlib>=1.0; python_version >= '3.12'", "oldlib; python_version < '3.12'",
        "winlib; sys_platform == 'win32'", "hostlib>=2.0", "extralib; extra == 'fast'"))
    for name in ("newlib", "oldlib", "winlib", "extralib"):
        make_wheel(idx, name, "1.0")
    make_wheel(idx, "newlib", "1.1")
    make_wheel(idx, "hostlib", "2.5")
    return idx


def names(resolved) -> set[str]:  # type: ignore[no-untyped-def]
    return set(resolved.wheels)


def test_markers_are_evaluated_for_the_target_python_and_platform(tmp_path: Path, index: Path) -> None:
    r312 = resolve(["app==1.0"], target=PY312, host=HostPackages(), cache=tmp_path / "c1", fetch=local_fetch(index))
    assert names(r312) == {"app", "newlib", "hostlib"}
    r311 = resolve(["app==1.0"], target=Target(python="3.11"), host=HostPackages(), cache=tmp_path / "c2",
                   fetch=local_fetch(index))
    assert names(r311) == {"app", "oldlib", "hostlib"}


def test_an_extra_asked_for_brings_its_requirements(tmp_path: Path, index: Path) -> None:
    r = resolve(["app[fast]==1.0"], target=PY312, host=HostPackages(), cache=tmp_path / "c", fetch=local_fetch(index))
    assert "extralib" in names(r)


def test_packages_the_host_has_at_a_satisfying_version_are_skipped(tmp_path: Path, index: Path) -> None:
    host = HostPackages.parse("hostlib==2.1\nnewlib\n# comment\n")
    r = resolve(["app==1.0"], target=PY312, host=host, cache=tmp_path / "c1", fetch=local_fetch(index))
    assert names(r) == {"app"}
    assert r.skipped == {"hostlib": "host has 2.1", "newlib": "host has it"}
    too_old = HostPackages.parse("hostlib==1.9\n")
    r = resolve(["app==1.0"], target=PY312, host=too_old, cache=tmp_path / "c2", fetch=local_fetch(index))
    assert "hostlib" in names(r)


def test_pins_pick_the_version_and_excluded_names_are_left_out(tmp_path: Path, index: Path) -> None:
    r = resolve(["app==1.0"], target=PY312, host=HostPackages(), cache=tmp_path / "c", fetch=local_fetch(index),
                pins={"newlib": "1.0"}, exclude=["hostlib"])
    assert r.wheels["newlib"].name.startswith("newlib-1.0-")
    assert "hostlib" not in names(r) and r.skipped["hostlib"] == "excluded"


def test_wheels_already_in_the_cache_are_not_fetched_again(tmp_path: Path, index: Path) -> None:
    calls: list[str] = []
    cache = tmp_path / "c"
    resolve(["app==1.0"], target=PY312, host=HostPackages(), cache=cache, fetch=local_fetch(index, calls))
    first = len(calls)
    resolve(["app==1.0"], target=PY312, host=HostPackages(), cache=cache, fetch=local_fetch(index, calls))
    assert first == 3 and len(calls) == first


def test_a_wheel_for_another_platform_in_the_cache_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    make_wheel(cache, "native", "1.0", tag="cp312-cp312-win_amd64")
    idx = tmp_path / "idx"
    make_wheel(idx, "native", "1.0", tag="cp312-cp312-manylinux_2_17_x86_64")
    r = resolve(["native"], target=PY312, host=HostPackages(), cache=cache, fetch=local_fetch(idx))
    assert "manylinux" in r.wheels["native"].name


def test_dropped_files_leave_the_wheel_and_its_record(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "big", "1.0", files={"big/__init__.py": b"", "big/_fa2.so": b"x" * 1000,
                                                       "big/dg/_C.cpython-313-x86_64-linux-gnu.so": b"y"})
    out = tmp_path / "out" / wheel.name
    out.parent.mkdir()
    dropped = drop_files(wheel, ["big/_fa2.so", "big/dg/_C.cpython-313-*.so"], out)
    assert sorted(dropped) == ["big/_fa2.so", "big/dg/_C.cpython-313-x86_64-linux-gnu.so"]
    with zipfile.ZipFile(out) as zf:
        assert "big/_fa2.so" not in zf.namelist() and "big/__init__.py" in zf.namelist()
        record = zf.read("big-1.0.dist-info/RECORD").decode()
    assert "_fa2.so" not in record and "big/__init__.py" in record
    assert drop_files(wheel, ["nothing/*"], tmp_path / "unused.whl") == []


def _bundle(tmp_path: Path, index: Path) -> Path:
    out = tmp_path / "bundle"
    make_wheel(index, "padding", "1.0", files={"padding/data.bin": random.Random(0).randbytes(10240)})
    build(["app==1.0", "padding"], out=out, target=PY312, host=HostPackages(), cache=tmp_path / "cache",
          fetch=local_fetch(index), chunk_mb=4096 / 2**20)      # 4 KiB chunks: several per wheel
    return out


def test_chunks_reassemble_to_the_same_wheels(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    manifest = json.loads((out / MANIFEST).read_text())
    assert len(manifest["chunks"]) > 2 and all(c["size"] <= 4096 for c in manifest["chunks"])
    assert {w["name"] for w in manifest["wheels"]} == {"app", "newlib", "hostlib", "padding"}
    assert (out / "install_bundle.py").exists()
    wheels = reassemble(out, work=tmp_path / "re")
    cache = tmp_path / "cache"
    for wheel in wheels:
        assert wheel.read_bytes() == (cache / wheel.name).read_bytes()


def test_chunks_moved_to_other_folders_are_found_there(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    elsewhere = tmp_path / "elsewhere"
    (out / "part-001").rename(elsewhere)
    with pytest.raises(BundleError, match="not found"):
        reassemble(out, work=tmp_path / "re1")
    assert len(reassemble(out, chunk_dirs=[elsewhere], work=tmp_path / "re2")) == 4


def test_a_corrupted_chunk_is_detected(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    chunk = out / "part-001" / "chunk-001.bin"
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="chunk-001.bin is corrupt"):
        install(out, dry_run=True)


def test_install_puts_the_wheels_into_the_target(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    site = tmp_path / "site"
    install(out, target=site)
    assert (site / "newlib" / "__init__.py").read_text() == "VERSION = '1.1'\n"
    assert (site / "padding" / "data.bin").stat().st_size == 10240


def test_the_installer_next_to_the_chunks_needs_only_the_stdlib(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    # -I -S: no site-packages (no packaging, pydantic, ratchet); what the air-gapped host may have.
    proc = subprocess.run([sys.executable, "-I", "-S", str(out / "install_bundle.py"), "install", str(out),
                           "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "verified 4 wheels" in proc.stdout


def test_ratchet_bundle_install_reports_a_bad_bundle_with_exit_code_2(tmp_path: Path, index: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = _bundle(tmp_path, index)
    assert ratchet(["bundle", "install", str(out), "--dry-run"]) == 0
    (out / "part-000" / "chunk-000.bin").unlink()
    assert ratchet(["bundle", "install", str(out), "--dry-run"]) == 2
    assert "chunk-000.bin not found" in capsys.readouterr().err


def _packed_bundle(tmp_path: Path, index: Path, *, carried: Path) -> Path:
    out = tmp_path / "packed"
    make_wheel(index, "padding", "1.0", files={"padding/data.bin": bytes(20000) + random.Random(0).randbytes(2048)})
    build(["app==1.0", "padding"], out=out, target=PY312, host=HostPackages(), cache=tmp_path / "cache",
          fetch=local_fetch(index), chunk_mb=4096 / 2**20, files=[carried], packing="xz")
    return out


def test_xz_packing_restores_stored_wheels_with_the_same_members_and_carries_files(tmp_path: Path,
                                                                                   index: Path) -> None:
    deb = tmp_path / "tool_1.0_amd64.deb"
    deb.write_bytes(b"!<arch>\n" + bytes(5000))
    out = _packed_bundle(tmp_path, index, carried=deb)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["format"] == "ratchet-bundle/2" and manifest["packing"] == "xz"
    assert manifest["total_bytes"] < manifest["unpacked_bytes"]       # the zeros compress
    assert [f["file"] for f in manifest["files"]] == [deb.name]
    restored = {p.name: p for p in reassemble(out, work=tmp_path / "re")}
    for wheel in (tmp_path / "cache").glob("*.whl"):
        if wheel.name not in restored:
            continue
        with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(restored[wheel.name]) as b:
            assert a.namelist() == b.namelist()
            assert all(a.read(n) == b.read(n) for n in a.namelist())
            assert {i.compress_type for i in b.infolist()} == {zipfile.ZIP_STORED}
    assert restored[deb.name].read_bytes() == deb.read_bytes()
    site, files = tmp_path / "site", tmp_path / "files"
    install(out, target=site, files_to=files)
    assert (site / "padding" / "data.bin").stat().st_size == 22048
    assert (files / deb.name).read_bytes() == deb.read_bytes()


def test_packed_blobs_are_cached_and_a_corrupt_packed_chunk_is_still_caught(tmp_path: Path, index: Path) -> None:
    deb = tmp_path / "tool.deb"
    deb.write_bytes(b"deb")
    out = _packed_bundle(tmp_path, index, carried=deb)
    blobs = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache" / "packed").glob("*.xz")}
    assert len(blobs) == 5       # 4 wheels and the file
    build(["app==1.0", "padding"], out=tmp_path / "again", target=PY312, host=HostPackages(), cache=tmp_path / "cache",
          fetch=local_fetch(index), files=[deb], packing="xz")
    assert {p: p.stat().st_mtime_ns for p in blobs} == blobs
    chunk = out / "part-000" / "chunk-000.bin"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="chunk-000.bin is corrupt"):
        reassemble(out, work=tmp_path / "re")


def test_a_bundle_of_the_first_format_still_installs(tmp_path: Path, index: Path) -> None:
    out = _bundle(tmp_path, index)
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["format"] = "ratchet-bundle/1"
    for key in ("files", "packing", "unpacked_bytes"):
        manifest.pop(key)
    for rec in manifest["wheels"]:
        rec.pop("packed"), rec.pop("unpacked_size")
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert len(reassemble(out, work=tmp_path / "re")) == 4


def test_a_pin_file_may_carry_comments(tmp_path: Path) -> None:
    from sandbox.bundle_build import read_pins

    pins = tmp_path / "pins.txt"
    pins.write_text("# one name==version a line\nfoo-bar==1.2  # why\nBaz_Q-2.0-py3-none-any.whl\n")
    assert read_pins(pins) == {"foo-bar": "1.2", "baz-q": "2.0"}
