"""Scale-out on a real local Ray cluster (a head and a second worker node, one CPU each), with real vLLM
(CPU) evaluations: two candidates measured at once, one worker SIGKILLed mid-evaluation. The campaign
must retry it, finish, commit at most one candidate per round and leave a log that verifies."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from audit.reader import payload_of, read_records
from tests.agent.test_campaign_vllm import UNISOLATED, _results, _run, _spec
from tests.conftest import ROOT, processes_under

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
RAY = str(Path(sys.executable).with_name("ray"))
HEAD_PORT = 6391
# Token authentication on every process of the cluster (head, worker node, the campaign's driver), with a
# token of this test's own: Ray's default depends on whether ~/.ray/auth_token happens to exist.
RAY_ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _ray(*args: str) -> None:
    proc = subprocess.run([RAY, *args], capture_output=True, text=True, timeout=180, env=RAY_ENV)
    assert proc.returncode == 0, f"ray {' '.join(args)} failed:\n{proc.stderr[-3000:]}"


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[str]:
    """Two raylets on this host: the head and one worker node, each offering one CPU and one `slot`."""
    pytest.importorskip("ray")
    common = ["--num-cpus", "1", "--resources", json.dumps({"ratchet_slot": 1}), "--disable-usage-stats"]
    _ray("start", "--head", "--port", str(HEAD_PORT), "--include-dashboard", "false", *common)
    try:
        _ray("start", "--address", f"127.0.0.1:{HEAD_PORT}", *common)
        yield f"127.0.0.1:{HEAD_PORT}"
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=180, env=RAY_ENV)


def _kill_first_evaluation(runs: Path, stop: threading.Event, killed: list[dict[str, object]]) -> None:
    """Once an evaluation's first server is starting, SIGKILL the Ray worker process running it."""
    while not stop.is_set():
        for placement in sorted(runs.glob("it*/placement-attempt1.json")):
            if (placement.parent / "server-A.log").exists():
                info = json.loads(placement.read_text())
                os.kill(int(info["pid"]), signal.SIGKILL)
                killed.append({"iteration_dir": placement.parent.name, **info})
                return
        time.sleep(0.5)


@pytest.mark.timeout(2400)   # a whole campaign: screens, a confirmation and the final comparison
def test_a_parallel_campaign_survives_a_killed_worker_and_its_log_verifies(tmp_path: Path,
                                                                            ray_cluster: str) -> None:
    proposer = ("proposer: {kind: search, search: {strategy: grid, space: {max_num_seqs: [1, 4, 8]}}}\n"
                "profile_baseline: false\n"
                f"executor: {{kind: ray, slots: 2, ray: {{address: '{ray_cluster}', num_cpus: 1, "
                "resources: {ratchet_slot: 1}, max_retries: 1}}")
    spec = _spec(tmp_path, proposer, "{max_iterations: 2, wall_seconds: 3600}", name="ray", extra=UNISOLATED)
    logs = tmp_path / "logs"
    stop, killed = threading.Event(), []
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(spec), "--log-dir", str(logs),
                             "--workspaces", str(tmp_path / "ws")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=RAY_ENV)
    killer = None
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and proc.poll() is None and not list(logs.glob("*/runs")):
            time.sleep(1)
        (log_dir,) = logs.iterdir()
        killer = threading.Thread(target=_kill_first_evaluation, args=(log_dir / "runs", stop, killed), daemon=True)
        killer.start()
        out, err = proc.communicate(timeout=1800)
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
    assert results[killed_it]["outcome"] in ("accepted", "rejected"), results[killed_it]["reason"]
    assert all(results[i]["placement"]["executor"] == "ray" and results[i]["placement"]["node_id"] for i in (1, 2))
    # Both points (max_num_seqs 4 and 8 against 1) beat the incumbent; only one may become the new one.
    outcomes = sorted(str(results[i]["outcome"]) for i in (1, 2))
    assert outcomes.count("accepted") <= 1
    if outcomes == ["accepted", "rejected"]:
        loser = next(i for i in (1, 2) if results[i]["outcome"] == "rejected")
        assert str(results[loser]["reason"]).startswith(("superseded", "speedup", "cells regressed"))
    verify = _run("audit", "verify", str(log_dir), timeout=300)
    assert verify.returncode == 0 and f"verified {len(records)} records" in verify.stdout, verify.stdout
    assert not processes_under(log_dir), "servers of the killed attempt were left running"
