"""Score every benchmark request of a campaign's runs against the copy-task's known answers.

    .venv/bin/python experiments/workload_answers.py LOG_DIR [--out FILE.json]

For each measured A/B (and the baseline grid) it reports, per server: requests, wrong answers; and per A/B:
requests wrong on only one side (discordant), wrong on both with the same text (the model's own
deterministic errors), and the sign test workload parity applies (harness/workload.py). It reads what the
harness saved: the client's job list, each run's result JSON (`--save-detailed`: generated texts) and the
prompt files the harness wrote (`benchmark.dataset: copy-task`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.datasets import copy_task_answer  # noqa: E402
from harness.workload import sign_test  # noqa: E402


def _runs(bench: Path) -> list[dict[str, object]]:
    """One entry per run: server, cell file, request texts and their answers."""
    job_lists = sorted(bench.glob("tmp*.json"))
    if not job_lists:
        return []
    out = []
    for index, argv in enumerate(json.loads(job_lists[0].read_text())):
        result = bench / f"job{index:04d}.json"
        if "--dataset-path" not in argv or not result.exists():
            continue
        prompts_file = bench / Path(argv[argv.index("--dataset-path") + 1]).name
        output_len = int(argv[argv.index("--custom-output-len") + 1])
        prompts = [json.loads(line)["prompt"] for line in prompts_file.read_text().splitlines() if line.strip()]
        texts = json.loads(result.read_text())["generated_texts"]
        wrong = [t.split() != copy_task_answer(p, output_len) for p, t in zip(prompts, texts, strict=True)]
        out.append({"server": argv[argv.index("--base-url") + 1], "cell": prompts_file.stem, "wrong": wrong,
                    "texts": texts})
    return out


def score(bench: Path) -> dict[str, object] | None:
    runs = _runs(bench)
    if not runs:
        return None
    servers = sorted({str(r["server"]) for r in runs})
    per = {s: {"requests": sum(len(r["wrong"]) for r in runs if r["server"] == s),
               "wrong": sum(sum(r["wrong"]) for r in runs if r["server"] == s)} for s in servers}
    report: dict[str, object] = {"bench": str(bench), "servers": per}
    if len(servers) == 2:
        a, b = servers
        by_cell = {(r["cell"], r["server"]): r for r in runs}
        only_a = only_b = same_wrong = 0
        for cell in sorted({str(r["cell"]) for r in runs}):
            ra, rb = by_cell.get((cell, a)), by_cell.get((cell, b))
            if ra is None or rb is None:
                continue
            for wa, wb, ta, tb in zip(ra["wrong"], rb["wrong"], ra["texts"], rb["texts"], strict=True):
                only_a += wa and not wb
                only_b += wb and not wa
                same_wrong += wa and wb and ta == tb
        report.update(wrong_only_on={a: only_a, b: only_b}, wrong_on_both_identically=same_wrong,
                      sign_test_p={a: sign_test(only_a, only_b), b: sign_test(only_b, only_a)})
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    benches = sorted(args.log_dir.glob("runs/*/bench")) + sorted(args.log_dir.glob("runs/baseline/bench-*"))
    reports = [r for r in map(score, benches) if r is not None]
    for r in reports:
        print(json.dumps(r))
    if args.out:
        args.out.write_text(json.dumps({"log_dir": str(args.log_dir), "command":
                                        "experiments/workload_answers.py LOG_DIR", "runs": reports}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
