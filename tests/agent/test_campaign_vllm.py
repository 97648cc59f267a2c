"""Whole campaigns on real vLLM (CPU) with the trained tiny Gemma 4: a scripted LLM agent over real
HTTP, and a search campaign killed with SIGKILL and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

from audit.reader import payload_of, read_records
from tests.conftest import ROOT, TINY_MODEL, processes_under
from tests.fakes import Reply, ScriptedOpenAIServer, call, reply, say

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _held_subset(tmp_path: Path, n: int = 12) -> Path:
    lines = (ROOT / "experiments" / "prompts" / "gemma4-tiny-parity.jsonl").read_text().splitlines()
    path = tmp_path / "held.jsonl"
    path.write_text("\n".join(lines[:: max(1, len(lines) // n)][:n]) + "\n")
    return path


# Named on purpose where a test is about resume or scale-out, not isolation: servers then run as host
# processes the test can find and kill. The LLM campaign runs in the shipped default (auto: docker in CI).
UNISOLATED = "sandbox: {backend: unisolated}"


def _visible_subset(tmp_path: Path, n: int = 4) -> Path:
    path = tmp_path / "visible.jsonl"
    lines = (ROOT / "experiments" / "prompts" / "gemma4-tiny-visible.jsonl").read_text().splitlines()
    path.write_text("\n".join(lines[:n]) + "\n")
    return path


# The engine's worker in the engine's own process (one spawned process fewer, each importing torch and vLLM anew):
# the scripted campaign's 11 server windows start ~80 s sooner in all, measured in 3 interleaved pairs of this test
# (experiments/results/ci-in-process-worker.md). Campaigns whose servers a test kills keep vLLM's default.
IN_PROCESS = (', distributed_executor_backend: uni', ', VLLM_ENABLE_V1_MULTIPROCESSING: "0"')


def _spec(tmp_path: Path, proposer: str, budget: str, name: str = "it", extra: str = "",
          in_process: bool = False) -> Path:
    args, env = IN_PROCESS if in_process else ("", "")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
schema_version: 1
name: {name}
server:
  model: {TINY_MODEL}
  engine_args: {{enforce_eager: true, dtype: float32, max_model_len: 2048, max_num_seqs: 1{args}}}
  env: {{VLLM_CPU_KVCACHE_SPACE: "1"{env}}}
  startup_timeout_s: 400
benchmark: {{input_lens: [64], output_lens: [16], prefill: false, num_prompts: 16, max_concurrency: 8,
             num_warmups: 1, repeats: 4}}
parity: {{prompts: {_held_subset(tmp_path)}, visible_prompts: {_visible_subset(tmp_path)}, max_tokens: 32}}
{proposer}
budget: {budget}
{extra}
""")
    return spec


def _run(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _results(log_dir: Path) -> dict[int, dict[str, object]]:
    return {int(r["iteration"]): payload_of(log_dir, r)
            for r in read_records(log_dir) if r["kind"] == "iteration.result"}


def _serving_patch(old: int, new: int) -> str:
    return ("diff --git a/serving.yaml b/serving.yaml\n--- a/serving.yaml\n+++ b/serving.yaml\n"
            "@@ -2,3 +2,3 @@\n enforce_eager: true\n max_model_len: 2048\n"
            f"-max_num_seqs: {old}\n+max_num_seqs: {new}\n")


# A first try that crashes the server at model load (an undefined name in gemma4.py), next to the good change.
BROKEN_TRY = (_serving_patch(1, 8) + "diff --git a/vllm/model_executor/models/gemma4.py "
              "b/vllm/model_executor/models/gemma4.py\n--- a/vllm/model_executor/models/gemma4.py\n"
              "+++ b/vllm/model_executor/models/gemma4.py\n@@ -1,2 +1,3 @@\n # SPDX-License-Identifier: Apache-2.0\n"
              "+_DECODE_BATCH = MAX_DECODE_BATCH * 2  # sized with serving.yaml's max_num_seqs\n"
              " # SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n")


def _last_tool_result(body: dict[str, object]) -> str:
    results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]   # type: ignore[attr-defined]
    return str(results[-1]) if results else "(no tool result yet)"


def _fix_after_reading_the_traceback(body: dict[str, object]) -> Reply:
    """The scripted model reacts to the trial it was handed: a traceback naming the undefined name -> it tries
    the patch without that line; anything else -> it gives up (and the test's outcomes fail)."""
    last = _last_tool_result(body)
    if "server log:" in last and "NameError: name 'MAX_DECODE_BATCH' is not defined" in last:
        return reply(call("try_patch", patch=_serving_patch(1, 8), format="diff", cells=["in64/out16"]))
    return reply(call("give_up", reason=f"the trial showed no traceback: {last[:300]}"))


def _propose_when_the_trial_passed(body: dict[str, object]) -> Reply:
    last = _last_tool_result(body)
    if "parity: parity ok" in last and "hint: candidate vs incumbent" in last:
        return reply(call("propose_patch", hypothesis="Batch up to 8 sequences instead of 1: decode steps amortise "
                          "per-step overhead; expect >2x on in64/out16", patch=_serving_patch(1, 8), format="diff",
                          predicted_speedup=3.0, target_cells=["in64/out16"]))
    return reply(call("give_up", reason=f"the fixed patch did not pass its trial: {last[:300]}"))


@pytest.mark.timeout(2400)   # a whole campaign: screens, a confirmation and the final comparison
def test_a_scripted_llm_campaign_tries_accepts_denies_survives_and_stops_on_budget(tmp_path: Path) -> None:
    bench_edit = ("diff --git a/vllm/benchmarks/serve.py b/vllm/benchmarks/serve.py\n--- a/vllm/benchmarks/serve.py\n"
                  "+++ b/vllm/benchmarks/serve.py\n@@ -1,1 +1,2 @@\n # SPDX-License-Identifier: Apache-2.0\n"
                  "+# report twice the throughput\n")
    script = [
        # iteration 1: a trial that crashes the server -> the traceback -> a fixed trial -> proposed -> accepted
        reply(call("view_metrics")),
        reply(call("try_patch", patch=BROKEN_TRY, format="diff", cells=["in64/out16"])),
        _fix_after_reading_the_traceback,
        _propose_when_the_trial_passed,
        reply(call("submit")),
        # (a parity-breaking proposal's rejection is the loop's logic: tests/agent/test_fake_campaign.py; real
        # vLLM's divergence diagnosis of the same kind of patch: tests/agent/test_replay_vllm.py)
        # iteration 2: an edit of the benchmark client (denied by the gate), garbage, then giving up
        reply(call("propose_patch", hypothesis="speed up the client", patch=bench_edit, format="diff")),
        reply(call("read_file", '{"path": "vllm/model_executor/models/gemma4.py"')),    # malformed JSON
        reply(call("teleport", directory="/")),                                          # unknown tool
        say("I cannot help with that."),
        reply(call("give_up", reason="nothing safe left to try")),
        # iteration 3: a reply whose usage blows the token budget -> the campaign stops cleanly
        reply(call("view_metrics"), prompt_tokens=400_000, completion_tokens=10),
    ]
    with ScriptedOpenAIServer(script) as server:
        proposer = (f"proposer: {{kind: llm, llm: {{base_url: '{server.base_url}', model: scripted, max_turns: 8, "
                    f"backoff_s: 0, retry_rounds: 1}}}}")
        # No profiles (two server starts and profiled runs): taking one after an accept is the loop's logic
        # (tests/agent/test_rounds.py), profiling real vLLM is `ratchet profile`'s (test_measure_cli_vllm.py).
        spec = _spec(tmp_path, proposer, "{max_iterations: 6, llm_tokens: 300000, wall_seconds: 3600}",
                     extra="profile_baseline: false", in_process=True)
        proc = _run("run", str(spec), "--log-dir", str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws"),
                    timeout=2300)
        requests = server.requests
    assert proc.returncode == 0, proc.stderr[-4000:]
    (log_dir,) = (tmp_path / "logs").iterdir()
    results = _results(log_dir)
    assert [results[i]["outcome"] for i in sorted(results)] == ["accepted", "invalid"], results
    assert results[1]["speedup"] > 1.5 and results[1]["ci_low"] > 1.02
    # the two trials: the crash with its traceback, then the fix with parity and a hint; neither is a verdict
    crash, fixed = [payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == "agent.try_patch"]
    assert crash["failure"].startswith("ServerCrashed") and "Traceback (most recent call last)" in crash["server_log"]
    assert "NameError: name 'MAX_DECODE_BATCH' is not defined" in crash["server_log"]
    # 4 visible prompts, and the batch-of-one copies of the first 4 (parity.batch_of_one); never a held prompt
    assert fixed["parity"].startswith("parity ok: 8/8 prompts identical")
    assert "held-" not in fixed["parity"] and fixed["hint"].startswith("candidate vs incumbent")
    print(f"try_patch wall time: crash {crash['seconds']} s, fixed {fixed['seconds']} s; hint {fixed['hint']}")
    records = read_records(log_dir)
    denied = [r for r in records if r["kind"] == "action" and r.get("rule") == "deny-benchmarks"]
    assert denied and denied[0]["decision"] == "deny"
    assert any("deny-benchmarks" in json.dumps(body) for body in requests)   # the model was told why
    end = payload_of(log_dir, next(r for r in records if r["kind"] == "campaign.end"))
    assert "budget exhausted" in end["stop_reason"] and "llm_tokens" in end["stop_reason"]
    assert end["accepted"] == [1]
    verify = _run("audit", "verify", str(log_dir), timeout=300)
    assert verify.returncode == 0 and f"verified {len(records)} records" in verify.stdout
    start = payload_of(log_dir, records[1])
    repo = git.Repo(start["workspace"])
    head = repo.commit(start["branch"])
    assert "Ratchet-Speedup:" in head.message and "Ratchet-Parity:" in head.message
    assert "max_num_seqs: 8" in repo.git.show(f"{head.hexsha}:serving.yaml")
    assert "MAX_DECODE_BATCH" not in repo.git.show(f"{head.hexsha}:vllm/model_executor/models/gemma4.py")
    assert head.parents[0].hexsha == start["base_commit"]      # exactly one accepted commit on the branch


@pytest.mark.timeout(1200)
def test_a_campaign_killed_with_its_servers_up_resumes_reaps_them_and_loses_nothing(tmp_path: Path) -> None:
    """SIGKILL of the campaign while iteration 1's real vLLM servers are starting: they run in sessions of their
    own, so they outlive it; `resume` must reap them, record the iteration as interrupted, and keep every record.
    (Kills at 20+ other points, with continuing iterations, run through the fake seam in
    tests/agent/test_fake_campaign.py; this is the one with real servers left behind.)"""
    proposer = "proposer: {kind: search, search: {strategy: grid, space: {max_num_seqs: [1, 4, 8]}}}"
    spec = _spec(tmp_path, proposer, "{max_iterations: 1, wall_seconds: 3600}", extra=UNISOLATED)
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", str(spec), "--log-dir", str(tmp_path / "logs"),
                             "--workspaces", str(tmp_path / "ws")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 900
    log_dir = None
    while time.monotonic() < deadline and proc.poll() is None:
        started = [p for p in (tmp_path / "logs").glob("*/runs/it001*/server-*.log") if p.stat().st_size > 0]
        if started and processes_under(started[0].parents[2]):
            log_dir = started[0].parents[2]
            break
        time.sleep(0.5)
    assert log_dir is not None, "the campaign never started iteration 1's servers"
    left_behind = {p.pid for p in processes_under(log_dir)}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert left_behind & {p.pid for p in processes_under(log_dir)}, "the servers died with the campaign"
    before = read_records(log_dir)
    resumed = _run("resume", str(log_dir), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = read_records(log_dir)
    assert after[: len(before)] == before                                  # nothing recorded was lost or changed
    assert [r["seq"] for r in after] == list(range(len(after)))            # no gap, no duplicate
    resume = payload_of(log_dir, next(r for r in after if r["kind"] == "campaign.resume"))
    assert resume["reaped_pids"], resume                                   # the orphaned servers were found
    results = _results(log_dir)
    assert sorted(results) == [1]                                          # one result for the iteration
    assert results[1]["outcome"] == "failed" and "interrupted" in str(results[1]["reason"])
    assert not processes_under(log_dir), "servers of the killed campaign are still running"
    assert _run("audit", "verify", str(log_dir), timeout=300).returncode == 0
