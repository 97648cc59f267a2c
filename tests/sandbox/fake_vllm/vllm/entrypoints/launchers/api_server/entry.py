"""A fake candidate server: serves /health (and /report with what its attack achieved) on --host/--port.

`--attack KIND` tries something a malicious candidate would; each attempt's outcome is recorded in
/report (JSON) and printed as `ATTACK <json>` lines. Stdlib only: it runs inside the sandbox image.
"""

import argparse
import errno
import json
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

REPORT: dict = {}


def _connect(host: str, port: int, timeout: float = 2.0) -> str:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "connected"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def _default_route() -> bool:
    with open("/proc/net/route") as f:
        return any(line.split()[1] == "00000000" for line in f.readlines()[1:])


def attack_network(args: argparse.Namespace) -> None:
    """Connect to every address the test names (the host's own addresses, the bridge gateway, another
    candidate): all are on this machine, so nothing is sent beyond it even if the sandbox were open."""
    REPORT["default_route"] = _default_route()
    own = socket.gethostbyname(socket.gethostname())
    REPORT["own_ip"] = own
    gateway = ".".join(own.split(".")[:3] + ["1"])
    targets = [t for t in args.targets.split(",") if t]
    if args.host_port:
        # The host's end of the link: .1 on a docker bridge, own address - 1 on the local netns /30.
        previous = ".".join(own.split(".")[:3] + [str(int(own.split(".")[3]) - 1)])
        targets += sorted({f"{gateway}:{args.host_port}", f"{previous}:{args.host_port}"})
    for target in targets:
        host, _, port = target.rpartition(":")
        REPORT[target] = _connect(host, int(port))


def attack_fork(args: argparse.Namespace) -> None:
    children = 0
    error = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and children < 100000:
        try:
            pid = os.fork()
        except OSError as exc:
            error = errno.errorcode.get(exc.errno, str(exc.errno))
            break
        if pid == 0:
            time.sleep(3600)
            os._exit(0)
        children += 1
    REPORT["forked"] = children
    REPORT["fork_error"] = error


def attack_memory(args: argparse.Namespace) -> None:
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))  # touched: bytearray zero-fills
        print(f"ATTACK allocated {len(hoard) * 64} MiB", flush=True)


def attack_write(args: argparse.Namespace) -> None:  # also reports uid, capabilities
    import vllm

    targets = {
        "workspace": os.path.join(os.path.dirname(vllm.__file__), "pwned.py"),
        "workspace_edit": vllm.__file__,
        "image_site_packages": os.path.join(os.path.dirname(os.__file__), "pwned.py"),
        "etc_passwd": "/etc/passwd",
        "root_dir": "/pwned",
        "model": os.path.join(args.model, "pwned"),
        "tmp": "/tmp/ok",
        "home": os.path.join(os.environ.get("HOME", "/nonexistent"), "ok"),
    }
    for name, path in targets.items():
        try:
            with open(path, "a") as f:
                f.write("# pwned\n")
            REPORT[name] = "written"
        except OSError as exc:
            REPORT[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    REPORT["uid"] = os.getuid()
    REPORT["docker_sock_visible"] = os.path.exists("/var/run/docker.sock") or os.path.exists(
        "/run/docker.sock"
    )
    REPORT["cap_eff"] = status["CapEff"].strip()
    REPORT["no_new_privs"] = status.get("NoNewPrivs", "?").strip()


def attack_read(args: argparse.Namespace) -> None:
    """Read what a candidate must never see: --targets names host paths (key, log, held prompts, another
    build's tree, the harness). Each is reported as "read" or the errno (ENOENT: not in the sandbox)."""
    for path in [t for t in args.targets.split(",") if t]:
        try:
            with open(path, "rb") as f:
                f.read(16)
            REPORT[path] = "read"
        except OSError as exc:
            REPORT[path] = errno.errorcode.get(exc.errno, str(exc.errno))
    REPORT["cwd"] = os.getcwd()
    REPORT["uid"] = os.getuid()


def attack_tmpfiles(args: argparse.Namespace) -> None:
    """Leave files for the harness to collect from /tmp/ratchet-collect: a trace, a link to a host file, and
    a link to a directory (only the trace may come out)."""
    folder = "/tmp/ratchet-collect"
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    with open(os.path.join(folder, "sub", "trace.json"), "w") as f:
        f.write('{"traceEvents": []}')
    for name, target in (("passwd", "/etc/passwd"), ("etc", "/etc")):
        if not os.path.lexists(os.path.join(folder, name)):
            os.symlink(target, os.path.join(folder, name))
    REPORT["written"] = True


class Handler(BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health" and self.healthy:
            body, code = b"ok", 200
        elif self.path == "/report":
            body, code = json.dumps(REPORT).encode(), 200
        else:
            body, code = b"not ready", 503
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="")
    p.add_argument("--attack", default="none")
    p.add_argument("--host-port", type=int, default=0)
    p.add_argument("--targets", default="", help="ip:port,ip:port to try to reach")
    args, _ = p.parse_known_args(sys.argv[1:])
    if args.attack == "never_healthy":
        Handler.healthy = False
    elif args.attack != "none":
        globals()[f"attack_{args.attack}"](args)
    print("ATTACK " + json.dumps(REPORT), flush=True)
    HTTPServer((args.host, args.port), Handler).serve_forever()
