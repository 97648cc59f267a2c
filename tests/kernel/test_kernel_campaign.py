"""A whole kernel campaign on the CPU, with a plain-torch kernel whose tunable REPEATS makes it slower: the search
finds REPEATS 1, it passes the checks, is accepted and committed, the final comparison shows it, and the audit
log verifies (re-deciding every gate decision under the kernel policy); `ratchet kernel` writes the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.kernel_campaign import start_kernel_campaign
from agent.kernel_spec import load_kernel_spec
from agent.measurements import HarnessMeasurements
from audit import verify
from audit.reader import payload_of, read_records
from policies import load_policy, redecider
from sandbox.workspace import Workspace
from tests.kernel.kernel_fakes import write_tree

# A verdict on ~0.1-2 ms CPU calls needs more than 8 rounds of 5 (see tests/kernel/test_kernel_resume.py's SPEC)
SPEC = """
schema_version: 1
name: torch-kernel-test
hardware: cpu
target: {kind: kernel, source: src/torchattn, module: attention.py}
device: cpu
dtype: float32
shapes:
  - {name: decode, batch: 2, q_len: 1, kv_len: 64, head_dim: 16, sliding_window: 24}
  - {name: prefill, batch: 1, q_len: 96, kv_len: 96, head_dim: 32}
timing: {rounds: 16, calls_per_round: 10, warmup_calls: 1, flush_l2: false}
roofline: null
proposer: {kind: search, search: {strategy: grid, space: {REPEATS: %s}}}
budget: {max_iterations: 3, wall_seconds: 600}
runner_timeout_s: 120
"""


@pytest.fixture
def audit_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    key = tmp_path / "keys" / "audit-key.ed25519"
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(key))
    return key


def _spec(tmp_path: Path, space: str) -> Path:
    write_tree(tmp_path / "src", repeats=4)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC % space)
    return path


def test_a_faster_tunable_is_found_checked_committed_logged_and_summarised(tmp_path: Path, audit_key: Path) -> None:
    spec_path = _spec(tmp_path, "[4, 1]")
    out = tmp_path / "summary.json"
    rc = main(["kernel", str(spec_path), "--log-dir", str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws"),
               "--out", str(out)])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["audit_verify"]["ok"]
    assert [i["outcome"] for i in summary["iterations"]] == ["accepted", "invalid"], summary["iterations"]
    assert summary["stop_reason"].startswith("proposer gave up: search space exhausted")
    assert summary["tunables_before"]["REPEATS"] == 4 and summary["tunables_after"]["REPEATS"] == 1
    for row in summary["shapes"]:
        assert row["before_median_us"] > row["after_median_us"] and row["speedup"] > 1
        assert row["after_checks"]["pre"]["ok"] and row["after_checks"]["post"]["ok"]
    assert out.with_suffix(".md").read_text().startswith("# Kernel campaign")
    ws = Workspace.open(Path(summary["workspace"]), "torchattn")
    assert "REPEATS = 1" in (ws.root / "torchattn" / "attention.py").read_text()
    assert "Ratchet-Speedup:" in ws.repo.head.commit.message and ws.is_clean()
    log_dir = Path(summary["log_dir"])
    checked = verify(log_dir, redecide=redecider([load_policy(load_kernel_spec(spec_path).policy_file)]))
    assert checked.ok, checked.reason
    kinds = [json.loads(line)["kind"] for line in (log_dir / "log.jsonl").read_text().splitlines()]
    for kind in ("campaign.start", "baseline.result", "iteration.patch", "kernel.evaluation", "final.result",
                 "campaign.end"):
        assert kind in kinds
    # Kept only after a second, independent evaluation with the builds in each other's positions (B's worker
    # first), whose figures are the ones on record, the screen's beside them
    payloads = [(r["kind"], payload_of(log_dir, r)) for r in read_records(log_dir)]
    evaluations = {p["name"]: p["order"] for kind, p in payloads if kind == "kernel.evaluation"}
    assert evaluations["it001"] == ["A", "B"] and evaluations["it001-confirm"] == ["B", "A"]
    # each runner's request, result and log are bound to the log before the evaluation that reads them
    steps = {p["step"]: sorted(p["files"]) for kind, p in payloads if kind == "evidence"}
    assert steps["final"] == ["runs/final/request.json", "runs/final/result.json", "runs/final/runner.log"]
    assert {"baseline", "it001", "it001-confirm"} <= set(steps) and checked.evidence_files >= 12
    (accepted,) = [p for kind, p in payloads if kind == "iteration.result" and p["accepted"]]
    assert accepted["reason"].startswith("confirmed: ") and "(screen: " in accepted["reason"]
    assert accepted["screen"]["ci_low"] > 1.02 and accepted["ci_low"] > 1.02
    assert accepted["speedup_text"] in ws.repo.head.commit.message


class _ConfirmationSeesNoGain(HarnessMeasurements):
    """The real runner; the confirmation's result is read with B timed as A was (no gain), and its order kept."""

    def __init__(self) -> None:
        self.confirm_orders: list[list[str]] = []

    def kernel(self, request: Any, work_dir: Path, **kw: Any) -> dict[str, Any]:
        result = super().kernel(request, work_dir, **kw)
        if work_dir.name.endswith("-confirm"):
            self.confirm_orders.append(list(result["builds"]))
            for shape in result["shapes"].values():
                shape["builds"]["B"]["round_medians_us"] = list(shape["builds"]["A"]["round_medians_us"])
        return result


def test_a_gain_its_confirmation_does_not_see_is_not_committed(tmp_path: Path, audit_key: Path) -> None:
    """One evaluation's worker processes can differ for the whole evaluation (experiments/results/kernel-aa-cpu.md:
    1 of 40 A/A evaluations accepted): a screen's acceptance alone commits nothing."""
    spec_path = _spec(tmp_path, "[1]")
    measure = _ConfirmationSeesNoGain()
    end = start_kernel_campaign(load_kernel_spec(spec_path), spec_path, log_root=tmp_path / "logs",
                                workspace_root=tmp_path / "ws", measure=measure)
    assert measure.confirm_orders == [["B", "A"]]
    (result,) = [p for r in read_records(end.log_dir) if r["kind"] == "iteration.result"
                 and (p := payload_of(end.log_dir, r))["source"]]
    assert result["outcome"] == "rejected" and not result["accepted"] and result["commit"] is None
    assert result["reason"].startswith("not confirmed: ") and result["screen"]["ci_low"] > 1.02
    assert result["speedup_text"].startswith("1.000x")
    ws = Workspace.open(end.workspace, "torchattn")
    assert "REPEATS = 4" in (ws.root / "torchattn" / "attention.py").read_text()
    assert ws.repo.head.commit.message.count("Ratchet-Speedup:") == 0
    assert verify(end.log_dir, redecide=redecider([load_policy(load_kernel_spec(spec_path).policy_file)])).ok


def test_ratchet_run_hands_a_kernel_spec_to_the_kernel_campaign(tmp_path: Path, audit_key: Path) -> None:
    spec_path = _spec(tmp_path, "[4]")       # nothing to try: the baseline, then the proposer gives up
    rc = main(["run", str(spec_path), "--log-dir", str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws")])
    assert rc == 0
    (log_dir,) = (tmp_path / "logs").iterdir()
    assert log_dir.name.startswith("torch-kernel-test-")
    assert verify(log_dir).ok


def _kernel_diff(source: str, old: str, new: str) -> str:
    import difflib

    after = source.replace(old, new, 1)
    assert after != source
    return "".join(difflib.unified_diff(source.splitlines(keepends=True), after.splitlines(keepends=True),
                                        "a/torchattn/attention.py", "b/torchattn/attention.py"))


def test_an_llm_agent_checks_a_broken_kernel_reads_its_error_fixes_it_and_the_fix_is_accepted(
        tmp_path: Path, audit_key: Path) -> None:
    from tests.fakes import Reply, ScriptedOpenAIServer, call, reply

    spec_path = _spec(tmp_path, "[4]")
    source = (tmp_path / "src" / "torchattn" / "attention.py").read_text()
    fixed = _kernel_diff(source, "REPEATS = 4\n", "REPEATS = 1\n")
    broken = _kernel_diff(source, "REPEATS = 4\n", "REPEATS = 1\n_SCRATCH = torch.empty(SCRATCH_SIZE)\n")

    def last_result(body: dict[str, object]) -> str:
        return [m["content"] for m in body["messages"] if m.get("role") == "tool"][-1]   # type: ignore[attr-defined]

    def fix_after_the_error(body: dict[str, object]) -> Reply:
        text = last_result(body)
        if "did not load" in text and "NameError: name 'SCRATCH_SIZE' is not defined" in text:
            return reply(call("check_kernel", patch=fixed, shapes=["decode", "prefill"]))
        return reply(call("give_up", reason=f"no load error shown: {text[:300]}"))

    def propose_when_correct(body: dict[str, object]) -> Reply:
        text = last_result(body)
        if "correctness: ok on every shape" in text and "hint: patched vs incumbent" in text:
            return reply(call("propose_patch", hypothesis="one pass instead of four", patch=fixed,
                              predicted_speedup=3.0))
        return reply(call("give_up", reason=f"the fix did not check out: {text[:300]}"))

    script = [reply(call("read_file", path="torchattn/attention.py")),
              reply(call("check_kernel", patch=broken)), fix_after_the_error, propose_when_correct,
              reply(call("submit"))]
    spec_path.write_text(spec_path.read_text().replace("budget: {max_iterations: 3, wall_seconds: 600}",
                                                       "budget: {max_iterations: 1, wall_seconds: 600}"))
    out = tmp_path / "summary.json"
    with ScriptedOpenAIServer(script) as server:
        rc = main(["kernel", str(spec_path), "--proposer", "llm", "--llm-base-url", server.base_url,
                   "--llm-model", "scripted", "--log-dir", str(tmp_path / "logs"), "--workspaces",
                   str(tmp_path / "ws"), "--out", str(out)])
        offered = [t["function"]["name"] for t in server.requests[0]["tools"]]
        system = server.requests[0]["messages"][0]["content"]
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["audit_verify"]["ok"]
    assert [i["outcome"] for i in summary["iterations"]] == ["accepted"], summary["iterations"]
    assert "check_kernel" in offered and "try_patch" not in offered and "kernel engineer" in system
    log_dir = Path(summary["log_dir"])
    records = [json.loads(line) for line in (log_dir / "log.jsonl").read_text().splitlines()]
    from audit.reader import payload_of

    first, second = [payload_of(log_dir, r)["text"] for r in records if r["kind"] == "agent.check_kernel"]
    assert "correctness: not run: the patched kernel did not load" in first and "line " in first
    assert "correctness: ok on every shape" in second
    print(f"check_kernel of the broken patch:\n{first}\n\ncheck_kernel of the fix:\n{second}")
    assert "REPEATS = 1" in (Path(summary["workspace"]) / "torchattn" / "attention.py").read_text()
