"""sandbox/host_tools.py and the bwrap argv built with it: the tools from PATH or from an unpacked folder named by
RATCHET_SANDBOX_TOOLS (run through the host's loader with that folder's libraries), checked before use, a missing
or unsafe one named; with GPUs, the device nodes bound as devices and the driver's library folders outside the
system folders bound read-only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandbox.base import Launch
from sandbox.errors import BackendUnavailable
from sandbox.host_tools import LOADER, TOOLS_ENV, HostTools, gpu_library_dirs, host_tools
from sandbox.local import _bwrap_argv


def _tools_root(root: Path) -> Path:
    """The layout scripts/gpu-setup.sh leaves after `dpkg -x` of the bundle's .debs (programs are stand-ins)."""
    for rel in ("usr/bin/bwrap", "bin/ip", "usr/sbin/xtables-nft-multi"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("#!/bin/sh\n")
        (root / rel).chmod(0o755)
    (root / "usr/lib/x86_64-linux-gnu/xtables").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libcap.so.2").write_bytes(b"\x7fELF")
    return root


def _launch(tmp_path: Path) -> Launch:
    return Launch(name="s", argv=("/usr/bin/python3", "-m", "vllm"), workspace=tmp_path / "tree", env={}, port=8000,
                  log_path=tmp_path / "log" / "server.log")


def test_without_the_setting_the_tools_come_from_path_and_a_missing_one_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailable, match=r"ip not found; apt-get install -y iproute2 .*gpu-setup\.sh"):
        host_tools({})
    for name in ("ip", "bwrap", "iptables"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert host_tools({}) == HostTools()


def test_unpacked_tools_run_through_the_hosts_loader_with_their_own_libraries(tmp_path: Path) -> None:
    root = _tools_root(tmp_path / "tools")
    tools = host_tools({TOOLS_ENV: str(root)})
    libs = str(root / "usr/lib/x86_64-linux-gnu")
    assert tools.bwrap == (str(LOADER), "--library-path", libs, str(root / "usr/bin/bwrap"))
    assert tools.ip[-1] == str(root / "bin/ip")
    assert tools.iptables[-2:] == (str(root / "usr/sbin/xtables-nft-multi"), "iptables")
    assert dict(tools.iptables_env) == {"XTABLES_LIBDIR": str(root / "usr/lib/x86_64-linux-gnu/xtables")}
    argv = _bwrap_argv(_launch(tmp_path), tools=tools)
    assert argv[:4] == list(tools.bwrap) and "--die-with-parent" in argv


def test_a_missing_unpacked_tool_is_named_with_the_package_that_brings_it(tmp_path: Path) -> None:
    root = _tools_root(tmp_path / "tools")
    (root / "usr/bin/bwrap").unlink()
    with pytest.raises(BackendUnavailable, match=r"has no bwrap .*bubblewrap_\*\.deb"):
        host_tools({TOOLS_ENV: str(root)})
    with pytest.raises(BackendUnavailable, match="not an absolute path of a folder"):
        host_tools({TOOLS_ENV: "relative/tools"})


def test_tools_another_user_could_replace_are_refused(tmp_path: Path) -> None:
    root = _tools_root(tmp_path / "tools")
    lib = root / "usr/lib/x86_64-linux-gnu/libcap.so.2"
    lib.chmod(0o666)
    with pytest.raises(BackendUnavailable, match=r"libcap\.so\.2 is writable by group or others"):
        host_tools({TOOLS_ENV: str(root)})
    lib.chmod(0o644)
    with pytest.raises(BackendUnavailable, match=f"owned by uid {os.geteuid()}, not 12345"):
        host_tools({TOOLS_ENV: str(root)}, uid=12345)


def test_gpus_bind_the_device_nodes_and_driver_folders_outside_the_system_ones(tmp_path: Path) -> None:
    nodes = [Path("/dev/nvidia0"), Path("/dev/nvidiactl"), Path("/dev/nvidia-uvm"), Path("/dev/nvidia-caps")]
    driver = tmp_path / "run" / "nvidia" / "driver" / "lib64"
    driver.mkdir(parents=True)
    argv = _bwrap_argv(_launch(tmp_path), gpus=1, gpu_nodes=nodes, gpu_libs=[driver])
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    for node in nodes:
        assert ("--dev-bind", str(node), str(node)) in pairs
    assert ("--ro-bind", str(driver), str(driver)) in pairs
    assert "--dev-bind" not in _bwrap_argv(_launch(tmp_path), gpus=0, gpu_nodes=nodes, gpu_libs=[driver])
    assert str(driver) not in _bwrap_argv(_launch(tmp_path), gpus=0, gpu_nodes=nodes, gpu_libs=[driver])


def test_driver_folders_under_usr_or_lib_are_already_bound_and_links_are_resolved(tmp_path: Path) -> None:
    real = tmp_path / "opt" / "nvidia" / "lib64"
    real.mkdir(parents=True)
    link = tmp_path / "nvidia-lib"
    link.symlink_to(real)
    found = gpu_library_dirs([Path("/usr/lib/x86_64-linux-gnu"), link, real, tmp_path / "absent"])
    assert found == [real.resolve()]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not LOADER.is_file(),
                    reason="starts a real sandbox: needs root, bwrap and the x86-64 loader")
def test_a_real_sandbox_starts_with_bwrap_from_an_unpacked_folder(tmp_path: Path) -> None:
    """This host's own bwrap copied into a tools folder (a stand-in for the bundle's, which scripts/gpu-setup.sh
    unpacks) runs through the loader and starts a sandbox; the probe says which tools it used."""
    from sandbox.local import _probe_bwrap

    root = _tools_root(tmp_path / "tools")
    (root / "usr/lib/x86_64-linux-gnu/libcap.so.2").unlink()    # the stand-in would be loaded first: it is
    shutil.copy2(str(shutil.which("bwrap")), root / "usr/bin/bwrap")
    tools = host_tools({TOOLS_ENV: str(root)})
    assert _probe_bwrap(tools) == ""
    (root / "usr/bin/bwrap").write_text("#!/bin/sh\nexit 1\n")
    broken = host_tools({TOOLS_ENV: str(root)})
    assert broken == tools          # same paths: the probe below runs the replaced program
    _probe_bwrap.cache_clear()
    assert f"{TOOLS_ENV}={root}" in _probe_bwrap(broken)
