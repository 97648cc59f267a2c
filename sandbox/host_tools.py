"""The host-side programs of the bwrap backend (bwrap, ip, iptables) and the GPU paths a sandboxed server needs.

Tools: from PATH, or, when `RATCHET_SANDBOX_TOOLS` names a folder, from the .deb packages unpacked there (an
offline GPU host without them: scripts/gpu-setup.sh unpacks the bundle's into /var/tmp/ratchet-tools). Those are
run through the host's loader with the folder's libraries (`ld-linux --library-path`), which applies to that one
program and is not inherited by what it starts (the server): nothing but glibc comes from the host. They run as
root, so the folder is checked before use: each program and library there must be owned by this user and
writable by no one else; a missing one is named with what to do.

GPU paths (`gpus` > 0): the device nodes /dev/nvidia* (nvidia-caps, a folder, included) bound as devices, and the
folders holding the driver's libraries (`ldconfig -p`'s libcuda, /usr/local/nvidia/lib64) bound read-only where
they lie outside the system folders the sandbox binds anyway (/usr, /lib*, /etc: e.g. /run/nvidia/driver, /opt).

    python3 -m sandbox.host_tools [--gpus N]     # what the backend would run, and whether a sandbox starts
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import BackendUnavailable

__all__ = ["TOOLS_ENV", "HostTools", "host_tools", "gpu_device_nodes", "gpu_library_dirs", "SYSTEM_PATHS"]

TOOLS_ENV = "RATCHET_SANDBOX_TOOLS"
LOADER = Path("/lib64/ld-linux-x86-64.so.2")
# The system's read-only parts a Python server needs (the loader, libraries, CA/locale/config files, CPU
# topology in /sys that vLLM's CPU backend reads); anything else comes in only by name.
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc", "/sys")
# Where each program lies in an unpacked Debian 12 tree (iproute2 ships /bin/ip; merged-/usr trees /usr/bin/ip).
_LAYOUT = {"bwrap": ("usr/bin/bwrap",), "ip": ("bin/ip", "usr/bin/ip", "sbin/ip", "usr/sbin/ip"),
           "iptables": ("usr/sbin/xtables-nft-multi",)}
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
_XTABLES = "usr/lib/x86_64-linux-gnu/xtables"


@dataclass(frozen=True)
class HostTools:
    """argv prefixes of the three programs, the environment iptables needs, and where they come from."""

    bwrap: tuple[str, ...] = ("bwrap",)
    ip: tuple[str, ...] = ("ip",)
    iptables: tuple[str, ...] = ("iptables",)
    iptables_env: tuple[tuple[str, str], ...] = ()
    root: Path | None = None

    def describe(self) -> str:
        return f"{TOOLS_ENV}={self.root}" if self.root else "PATH"


def _unsafe(path: Path, uid: int) -> str | None:
    st = path.lstat()
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not {uid}"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others"
    return None


def _check_owned(root: Path, programs: list[Path], uid: int) -> None:
    """The folder, the programs, the library folders and everything in them: owned by `uid`, written by no one else
    (these run as root; a file another user could replace would run as root too)."""
    paths = [root, *programs]
    for rel in (*_LIB_DIRS, _XTABLES):
        folder = root / rel
        if folder.is_dir():
            paths += [folder, *folder.iterdir()]
    for path in paths:
        why = _unsafe(path, uid)
        if why:
            raise BackendUnavailable(f"{TOOLS_ENV}: {why}; unpack the tools as this user into a folder only it "
                                     f"can write (scripts/gpu-setup.sh does), or unset {TOOLS_ENV}")


def _find(root: Path, name: str) -> Path:
    for rel in _LAYOUT[name]:
        if (root / rel).is_file() and os.access(root / rel, os.X_OK):
            return root / rel
    package = {"bwrap": "bubblewrap", "ip": "iproute2", "iptables": "iptables"}[name]
    raise BackendUnavailable(f"{TOOLS_ENV}={root} has no {name} (looked for {', '.join(_LAYOUT[name])}); "
                             f"scripts/gpu-setup.sh unpacks the bundle's {package}_*.deb there, or unset "
                             f"{TOOLS_ENV} to use PATH's")


def host_tools(environ: dict[str, str] | None = None, *, uid: int | None = None) -> HostTools:
    """The tools the backend runs: PATH's, or those under RATCHET_SANDBOX_TOOLS, checked (BackendUnavailable)."""
    env = os.environ if environ is None else environ
    value = env.get(TOOLS_ENV, "")
    if not value:
        for tool, package in (("ip", "iproute2"), ("bwrap", "bubblewrap"), ("iptables", "iptables")):
            if shutil.which(tool) is None:
                raise BackendUnavailable(f"{tool} not found; apt-get install -y {package} (an offline host: "
                                         f"scripts/gpu-setup.sh unpacks the bundle's and sets {TOOLS_ENV})")
        return HostTools()
    root = Path(value)
    if not root.is_absolute() or not root.is_dir():
        raise BackendUnavailable(f"{TOOLS_ENV}={value} is not an absolute path of a folder; run scripts/gpu-setup.sh "
                                 f"or unset {TOOLS_ENV}")
    if not LOADER.is_file():
        raise BackendUnavailable(f"{TOOLS_ENV}: this host has no {LOADER} to run the unpacked tools with")
    found = {name: _find(root, name) for name in _LAYOUT}
    _check_owned(root, list(found.values()), os.geteuid() if uid is None else uid)
    libs = ":".join(str(root / d) for d in _LIB_DIRS if (root / d).is_dir())

    def run(path: Path, *first: str) -> tuple[str, ...]:
        return (str(LOADER), "--library-path", libs, str(path), *first)

    return HostTools(bwrap=run(found["bwrap"]), ip=run(found["ip"]), iptables=run(found["iptables"], "iptables"),
                     iptables_env=(("XTABLES_LIBDIR", str(root / _XTABLES)),), root=root)


def gpu_device_nodes(dev: Path = Path("/dev")) -> list[Path]:
    """/dev/nvidia0.., nvidiactl, nvidia-uvm(-tools), nvidia-modeset and the nvidia-caps folder (MIG)."""
    return sorted(p for p in dev.glob("nvidia*") if p.exists())


def _ldconfig_dirs() -> list[Path]:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [Path(line.rsplit("=>", 1)[1].strip()).parent for line in out.splitlines()
            if "libcuda.so" in line and "=>" in line]


def gpu_library_dirs(candidates: list[Path] | None = None) -> list[Path]:
    """Folders of the driver's libraries that the system binds do not already cover (resolved, existing)."""
    found = _ldconfig_dirs() if candidates is None else candidates
    if candidates is None:
        found += [Path("/usr/local/nvidia/lib64"), Path("/usr/local/nvidia/lib")]
    out: list[Path] = []
    for folder in found:
        if not folder.is_dir():
            continue
        real = folder.resolve()
        if not any(real.is_relative_to(s) for s in SYSTEM_PATHS) and real not in out:
            out.append(real)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from sandbox.local import LocalBackend

    parser = argparse.ArgumentParser(prog="python3 -m sandbox.host_tools", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=0, help="check the GPU device nodes too")
    args = parser.parse_args(argv)
    try:
        tools = host_tools()
        print(f"tools from {tools.describe()}:\n  bwrap: {' '.join(tools.bwrap)}\n  ip: {' '.join(tools.ip)}\n"
              f"  iptables: {' '.join(tools.iptables)}")
        if args.gpus:
            print(f"GPU nodes: {' '.join(map(str, gpu_device_nodes())) or 'none'}; driver library folders bound: "
                  f"{' '.join(map(str, gpu_library_dirs())) or 'none beyond /usr, /lib*'}")
        LocalBackend.check_netns(gpus=args.gpus)
    except BackendUnavailable as exc:
        print(f"the bwrap sandbox cannot run here: {exc}")
        return 3
    print("the bwrap sandbox starts here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
