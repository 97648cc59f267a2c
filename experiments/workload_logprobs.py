"""How far the benchmark's own logprobs move between two servers of one build (A/A), from comparisons' run folders.

    .venv/bin/python experiments/workload_logprobs.py BENCH_DIR [BENCH_DIR ...] [--out FILE.json]

BENCH_DIR is a comparison's `bench/` folder (`ratchet compare`, a campaign's `runs/<step>/bench`): its
`timings.jsonl` names each job's build, cell and repeat, and each job's `jobNNNN.json.tokens.json` holds its
requests' generated token ids and top-k logprobs (harness/bench_driver.py). For every (cell, repeat), every
request of the reference build (the first tag in the folder) is compared with the same request on each other build
(harness.workload.token_drift): the largest logprob difference before the first divergence, and where the ids
first differ. Prints per build and cell, and overall: positions compared, the largest drift, its 99.9th percentile over
requests, divergences, and each build's requests wrong against the copy task's answers; writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from harness.bench import RequestTokens
from harness.datasets import copy_task_answer
from harness.workload import token_drift


def _tokens(path: Path) -> list[RequestTokens]:
    out = []
    for entry in json.loads(path.read_text())["requests"]:
        out.append(RequestTokens(token_ids=tuple(entry["token_ids"]), logprobs=tuple(entry["logprobs"]),
                                 top=tuple(tuple((int(i), float(v)) for i, v in pos) for pos in entry["top_logprobs"])))
    return out


def _wrong(bench: Path, job: str, cell: str, repeat: int) -> int:
    """Requests of one run whose text is not the copy task's answer (0 when the run's prompts are unknown)."""
    inp, out = (int(x[2:]) if x.startswith("in") else int(x[3:]) for x in cell.split("/"))
    prompts = bench / f"prompts-in{inp}-out{out}-r{repeat}.jsonl"
    if not prompts.exists():
        return 0
    texts = json.loads((bench / job).read_text())["generated_texts"]
    asked = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines() if line.strip()]
    return sum(text.split() != copy_task_answer(p, out) for text, p in zip(texts, asked, strict=True))


def analyse(bench: Path) -> dict[str, object]:
    rows = [json.loads(line) for line in (bench / "timings.jsonl").read_text().splitlines() if line.strip()]
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    runs = {(r["tag"], r["cell"], r["repeat"]): r["job"] for r in rows}
    cells: dict[str, dict[str, object]] = {}
    for (tag, cell, repeat), job in sorted(runs.items()):
        if tag == tags[0]:
            continue
        ref = _tokens(bench / f"{runs[(tags[0], cell, repeat)]}.tokens.json")
        cand = _tokens(bench / f"{job}.tokens.json")
        found = cells.setdefault(f"{tag} {cell}", {"positions": 0, "drifts": [], "divergences": 0, "wrong": {}})
        for a, b in zip(ref, cand, strict=True):
            pos, nats, _, _ = token_drift(a, b)
            found["positions"] += len(a.token_ids) if pos is None else pos          # type: ignore[operator]
            found["drifts"].append(nats)                                            # type: ignore[union-attr]
            found["divergences"] += pos is not None                                 # type: ignore[operator]
        wrong = found["wrong"]
        for who, name in ((tags[0], runs[(tags[0], cell, repeat)]), (tag, job)):
            wrong[who] = wrong.get(who, 0) + _wrong(bench, name, cell, repeat)      # type: ignore[union-attr]
    return {"bench": str(bench), "builds": tags, "cells": {c: _summary(v) for c, v in cells.items()}}


def _summary(found: dict[str, object]) -> dict[str, object]:
    drifts = sorted(found["drifts"])                                                # type: ignore[type-var]
    p999 = drifts[min(len(drifts) - 1, int(0.999 * len(drifts)))] if drifts else 0.0
    return {"requests": len(drifts), "positions": found["positions"], "max_drift": max(drifts, default=0.0),
            "p999_request_drift": p999, "median_request_drift": statistics.median(drifts) if drifts else 0.0,
            "divergences": found["divergences"], "wrong": found["wrong"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = [analyse(b) for b in args.bench]
    for result in results:
        print(result["bench"])
        for cell, s in result["cells"].items():                                     # type: ignore[attr-defined]
            print(f"  {cell:>24}: {s['requests']} requests, {s['positions']} positions, max drift "
                  f"{s['max_drift']:.2e}, p99.9 {s['p999_request_drift']:.2e}, {s['divergences']} divergences, "
                  f"wrong {s['wrong']}")
        worst = max((s["max_drift"] for s in result["cells"].values()), default=0.0)  # type: ignore[attr-defined]
        print(f"  overall max drift {worst:.2e}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
