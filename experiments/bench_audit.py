"""Cost of the gate and the audit log: µs per decision, µs per audited action (fsync included),
µs per checkpoint, and `verify` wall time on a 10,000-record log.

    .venv/bin/python experiments/bench_audit.py [--out experiments/results/audit-cost.json]

Runs on the real disk (a scratch folder under audit_logs/, removed afterwards) so fsync is real.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audit import AuditWriter, verify
from policies import Ledger, action_payload, decide, load_policy, parse_action, policy_sha256, redecider

REPO = Path(__file__).resolve().parents[1]
GEMMA = "vllm/model_executor/models/gemma4.py"
PATCH = (
    f"diff --git a/{GEMMA} b/{GEMMA}\n--- a/{GEMMA}\n+++ b/{GEMMA}\n@@ -10,3 +10,4 @@\n"
    " def forward(self, x):\n-    y = self.norm(x)\n+    y = self.norm(x)\n+    y = y * self.scale\n"
    "     return y\n"
)
ACTIONS = [
    {"kind": "patch", "diff": PATCH},
    {"kind": "write_file", "path": "tests/test_x.py"},
    {"kind": "read_file", "path": "vllm/model_executor/layers/layernorm.py"},
    {"kind": "run_command", "argv": ["git", "diff", "--stat"], "env": {"OMP_NUM_THREADS": "2"}},
    {"kind": "run_command", "argv": ["bash", "-c", "id"]},
    {"kind": "spend", "resource": "llm_tokens", "amount": 1000},
]


def _stats(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {
        "n": len(us),
        "mean_us": round(statistics.fmean(us), 2),
        "p50_us": round(us[len(us) // 2], 2),
        "p99_us": round(us[min(len(us) - 1, int(len(us) * 0.99))], 2),
    }


def _timed(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def bench_decide(n: int) -> dict[str, Any]:
    policy = load_policy(REPO / "policies" / "default.yaml")
    ledger = Ledger(spent={"llm_tokens": 5000.0})
    out: dict[str, Any] = {}
    for raw in ACTIONS:
        action = parse_action(json.dumps(raw))
        label = f"{raw['kind']}:{decide(policy, action, ledger).verdict}"
        out[label] = _stats(_timed(lambda a=action: decide(policy, a, ledger), n))  # type: ignore[misc]
    out["parse_action_patch"] = _stats(_timed(lambda: parse_action(json.dumps(ACTIONS[0])), n))
    return out


def bench_append(root: Path, n: int) -> dict[str, Any]:
    policy = load_policy(REPO / "policies" / "default.yaml")
    sha = policy_sha256(policy)
    ledger = Ledger(spent={"llm_tokens": 5000.0})
    actions = [parse_action(json.dumps(raw)) for raw in ACTIONS]
    key = root / "key.ed25519"
    with AuditWriter.open(
        root / "append", campaign="bench", key_path=key, anchor_dir=root / "anchors"
    ) as log:
        only_append, gated = [], []
        for i in range(n):
            action = actions[i % len(actions)]
            decision = decide(policy, action, ledger)
            payload = action_payload(action, ledger, decision=decision)
            start = time.perf_counter()
            log.append(
                "action",
                iteration=i // 10,
                action_id=str(i),
                payload=payload,
                decision=decision.verdict,
                rule=decision.rule,
                policy_sha256=sha,
            )
            only_append.append(time.perf_counter() - start)
        for i in range(n):
            start = time.perf_counter()
            action = actions[i % len(actions)]
            decision = decide(policy, action, ledger)
            log.append(
                "action",
                iteration=i // 10,
                action_id=f"g{i}",
                decision=decision.verdict,
                rule=decision.rule,
                policy_sha256=sha,
                payload=action_payload(action, ledger, decision=decision),
            )
            gated.append(time.perf_counter() - start)
        checkpoints = _timed(log.checkpoint, 50)
    return {
        "append_fsync": _stats(only_append),
        "decide_plus_append": _stats(gated),
        "checkpoint_sign_fsync_anchor": _stats(checkpoints),
    }


def bench_verify(root: Path, records: int) -> dict[str, Any]:
    policies = [load_policy(p) for p in sorted((REPO / "policies").glob("*.yaml"))]
    policy = load_policy(REPO / "policies" / "default.yaml")
    sha = policy_sha256(policy)
    ledger = Ledger()
    actions = [parse_action(json.dumps(raw)) for raw in ACTIONS]
    directory = root / "verify10k"
    start = time.perf_counter()
    with AuditWriter.open(
        directory, campaign="bench10k", key_path=root / "key.ed25519", anchor_dir=root / "anchors"
    ) as log:
        while log.next_seq < records - 1:
            if log.next_seq % 1000 == 999:
                log.checkpoint()
                continue
            action = actions[log.next_seq % len(actions)]
            decision = decide(policy, action, ledger)
            log.append(
                "action",
                iteration=log.next_seq // 100,
                action_id=str(log.next_seq),
                payload=action_payload(action, ledger, decision=decision),
                decision=decision.verdict,
                rule=decision.rule,
                policy_sha256=sha,
            )
    write_s = time.perf_counter() - start
    anchor = root / "anchors" / "bench10k.json"
    timings: dict[str, Any] = {"write_s": round(write_s, 3)}
    for label, kwargs in (
        ("verify_chain_signatures_anchor_s", {"anchor": anchor, "pubkey": root / "key.ed25519"}),
        ("verify_with_redecide_s", {"anchor": anchor, "redecide": redecider(policies)}),
    ):
        start = time.perf_counter()
        result = verify(directory, **kwargs)
        timings[label] = round(time.perf_counter() - start, 3)
        assert result.ok, result.reason
        timings["records"] = result.records
    timings["log_bytes"] = (directory / "log.jsonl").stat().st_size
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "audit-cost.json")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--appends", type=int, default=1000)
    parser.add_argument("--records", type=int, default=10_000)
    args = parser.parse_args()
    scratch = REPO / "audit_logs"
    scratch.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".bench-", dir=scratch))
    try:
        result = {
            "machine": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                "scratch_dir": str(root),
            },
            "decide": bench_decide(args.decisions),
            "audit": bench_append(root, args.appends),
            "verify": bench_verify(root, args.records),
            "command": "python experiments/bench_audit.py",
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
