"""Scale-out on a real local Ray cluster (a head and a second worker node, one CPU each), measuring through the
fake seam (tests/fake_measurements.py, whose "servers" are real processes on the worker's host): two candidates
measured at once, one Ray worker SIGKILLed mid-A/B. The campaign must retry it, finish, commit at most one
candidate per round and leave a log that verifies. Real vLLM A/Bs are the other campaign tests' (compare,
replay, the LLM campaign in test_campaign_vllm.py); this one is about the cluster, the loss and the record."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from audit.reader import payload_of, read_records
from tests.conftest import ROOT, processes_under
from tests.fake_campaign import write_target

RAY = str(Path(sys.executable).with_name("ray"))
# Token authentication on every process of the cluster (head, worker node, the campaign's driver), with a
# token of this test's own: Ray's default depends on whether ~/.ray/auth_token happens to exist.
# PYTHONPATH: the workers unpickle the tasks' code and the fake from this checkout, not an installed copy.
RAY_ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
HOLD_S = 3.0   # how long each fake A/B keeps its servers up: the window in which a worker is killed mid-A/B


def _ray_start(sessions: list[int], *args: str) -> None:
    """`ray start` in a session of its own, added to `sessions` (every daemon it leaves behind keeps its id)."""
    proc = subprocess.Popen([RAY, "start", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=RAY_ENV, start_new_session=True)
    sessions.append(proc.pid)   # before it can fail: what a failed start left is stopped too
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"ray start {' '.join(args)} failed:\n{err[-3000:]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _stop_cluster(sessions: list[int]) -> None:
    """SIGKILL every process of these `ray start` sessions: `ray stop` would stop every Ray cluster on the host,
    and a process's environment is no guide (Ray's process titles overwrite it)."""
    ours = [proc for proc in psutil.process_iter(["pid"]) if _session_of(proc.pid) in sessions]
    for proc in ours:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(ours, timeout=30)


@pytest.fixture
def ray_cluster() -> Iterator[str]:
    """Two raylets on this host: the head and one worker node, each offering one CPU and one `slot`."""
    pytest.importorskip("ray")
    address = f"127.0.0.1:{_free_port()}"
    common = ["--num-cpus", "1", "--resources", json.dumps({"ratchet_slot": 1}), "--disable-usage-stats"]
    sessions: list[int] = []
    try:   # ports of its own: another cluster may be up on a shared host
        _ray_start(sessions, "--head", "--port", address.split(":")[1], "--include-dashboard", "false",
                   "--ray-client-server-port", str(_free_port()), *common)
        _ray_start(sessions, "--address", address, *common)
        yield address
    finally:
        _stop_cluster(sessions)


def _kill_first_evaluation(runs: Path, stop: threading.Event, killed: list[dict[str, object]]) -> None:
    """Once a screen's servers are up (the fake's processes, mid-A/B), SIGKILL the Ray worker running it."""
    while not stop.is_set():
        for placement in sorted(runs.glob("it*/placement-attempt1.json")):
            if processes_under(placement.parent):   # written before the servers start: complete by now
                info = json.loads(placement.read_text())
                os.kill(int(info["pid"]), signal.SIGKILL)
                killed.append({"iteration_dir": placement.parent.name, **info})
                return
        time.sleep(0.2)


def _campaign(spec: Path, logs: Path, workspaces: Path) -> subprocess.Popen[str]:
    """The campaign in a child process of its own: a worker's SIGKILL must not touch pytest."""
    return subprocess.Popen([sys.executable, "-m", "tests.fake_campaign", "--hold-s", str(HOLD_S), "start",
                             str(spec), str(logs), str(workspaces)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=RAY_ENV)


def _results(log_dir: Path) -> dict[int, dict[str, Any]]:
    return {int(r["iteration"]): payload_of(log_dir, r)
            for r in read_records(log_dir) if r["kind"] == "iteration.result"}


@pytest.mark.timeout(600)   # a whole campaign: two raylets, screens, a retry, a confirmation, the final comparison
def test_a_parallel_campaign_survives_a_killed_worker_and_its_log_verifies(tmp_path: Path,
                                                                            ray_cluster: str) -> None:
    executor = (f"executor: {{kind: ray, slots: 2, ray: {{address: '{ray_cluster}', num_cpus: 1, "
                "resources: {ratchet_slot: 1}, max_retries: 1}}")
    spec = write_target(tmp_path, space="[1, 4, 8]", iterations=2, extra=executor)
    logs = tmp_path / "logs"
    stop, killed = threading.Event(), list[dict[str, object]]()
    proc = _campaign(spec, logs, tmp_path / "ws")
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not list(logs.glob("*/runs")):
            time.sleep(0.2)
        if proc.poll() is not None:   # it ended before its first evaluation: say why
            pytest.fail(f"the campaign exited {proc.returncode} early:\n{proc.communicate()[1][-4000:]}")
        (log_dir,) = logs.iterdir()
        killer = threading.Thread(target=_kill_first_evaluation, args=(log_dir / "runs", stop, killed), daemon=True)
        killer.start()
        _, err = proc.communicate(timeout=400)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    assert killed, "no evaluation was ever seen running"
    records = read_records(log_dir)
    start = payload_of(log_dir, next(r for r in records if r["kind"] == "executor.start"))
    assert start["kind"] == "ray" and start["slots"] == 2
    assert sum(1 for n in start["nodes"] if n["alive"]) == 2                       # head + worker node
    retries = [payload_of(log_dir, r) | {"iteration": r["iteration"]}
               for r in records if r["kind"] == "iteration.retry"]
    killed_it = int(str(killed[0]["iteration_dir"])[2:])
    assert [(r["iteration"], r["attempt"], r["error"]) for r in retries] == [(killed_it, 1, "WorkerCrashedError")]
    results = _results(log_dir)
    assert sorted(results) == [1, 2]                                               # both recorded, in order
    assert [r["iteration"] for r in records if r["kind"] == "iteration.result"] == [1, 2]
    screened = results[killed_it].get("screen", {}).get("placement") or results[killed_it]["placement"]
    assert screened["attempt"] == 2                                              # the retry measured it
    bound = [payload_of(log_dir, r) for r in records if r["kind"] == "evidence"
             and killed_it in payload_of(log_dir, r).get("iterations", ())]
    assert bound[0]["folder"] == f"runs/it{killed_it:03d}/retry1"                 # its files, not the dead attempt's
    assert results[killed_it]["outcome"] in ("accepted", "rejected"), results[killed_it]["reason"]
    assert all(results[i]["placement"]["executor"] == "ray" and results[i]["placement"]["node_id"] for i in (1, 2))
    # Both points beat the incumbent (max_num_seqs 4: 1.5x, 8: 2.0x against 1); only one may become the new one,
    # and with the fake's exact speeds it is 8: the other was measured against the incumbent it no longer is.
    assert [results[i]["outcome"] for i in (1, 2)] == ["rejected", "accepted"]
    assert str(results[1]["reason"]).startswith("superseded"), results[1]["reason"]
    verify = subprocess.run([sys.executable, "-m", "agent.cli", "audit", "verify", str(log_dir)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0 and f"verified {len(records)} records" in verify.stdout, verify.stdout
    assert not processes_under(log_dir), "servers of the killed attempt were left running"
