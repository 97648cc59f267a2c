"""Does the kernel accept rule's "95 %" hold at the rounds a kernel spec times? An A/A calibration on this host.

`record`: one long evaluation of a kernel spec with the same kernel file on both sides (two copies, so each build
is its own worker process, as in a campaign), timed as the spec times it but for many more rounds. `resample`: cut
the recorded rounds into campaign-sized comparisons (windows of consecutive rounds: a campaign's rounds are
neighbours in time, and that is where the noise that fools an interval lives), each in a random orientation, and
run harness.kernel.compare on each. On A/A data every acceptance is a false one; with B's times divided by a
planted factor (1.05, 1.10, 1.25) the acceptance rate is the rule's power. `live`: N separate A/A evaluations at
the spec's own timing (fresh worker processes each, which one long run cannot show), each judged as a campaign
judges a candidate.

    python experiments/kernel_aa.py record experiments/gemma4-attention-kernel-cpu.yaml --rounds 400 \\
        --out experiments/results/kernel-aa-cpu.json
    python experiments/kernel_aa.py resample experiments/results/kernel-aa-cpu.json --windows 4,8,12,20 --draws 1000
    python experiments/kernel_aa.py live experiments/gemma4-attention-kernel-cpu.yaml --count 40
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.kernel_spec import load_kernel_spec  # noqa: E402
from harness.config import StatsConfig  # noqa: E402
from harness.kernel.compare import compare  # noqa: E402
from harness.kernel.evaluate import run_evaluation  # noqa: E402
from harness.kernel.protocol import EvalRequest  # noqa: E402

PLANTED = (1.0, 1.05, 1.10, 1.25)


def _aa_evaluation(spec: Any, rounds: int, seed: int) -> tuple[dict[str, dict[str, list[float]]], dict[str, Any]]:
    """One runner evaluation of two copies of the spec's kernel file: per shape, each copy's round medians; and
    the device the runner describes."""
    with tempfile.TemporaryDirectory(prefix="kernel-aa-") as tmp:
        trees = {}
        for tag in ("A", "A2"):
            trees[tag] = Path(tmp) / tag
            shutil.copytree(spec.target.source, trees[tag])   # resolved against the spec's folder on load
        timing = spec.timing.model_dump() | {"rounds": rounds}
        req = EvalRequest(builds=trees, module=spec.target.module, entry=spec.target.entry, shapes=spec.shapes,
                          correctness=spec.correctness, timing=timing, device=spec.device, dtype=spec.dtype,
                          seed=seed)
        result = run_evaluation(req, Path(tmp), timeout_s=3600, interpret=spec.interpret)
    for name, entry in result["shapes"].items():
        bad = [tag for tag in ("A", "A2") if not entry["builds"][tag]["ok"]]
        if bad:
            raise SystemExit(f"{name}: {bad} failed its checks: {entry['builds'][bad[0]]}")
    return ({name: {tag: entry["builds"][tag]["round_medians_us"] for tag in ("A", "A2")}
             for name, entry in result["shapes"].items()}, result["device"])


def record(spec_path: Path, rounds: int, out: Path) -> None:
    spec = load_kernel_spec(spec_path)
    t0 = time.monotonic()
    shapes, device = _aa_evaluation(spec, rounds, seed=1)
    wall = time.monotonic() - t0
    out.write_text(json.dumps({"spec": str(spec_path), "spec_timing": spec.timing.model_dump(),
                               "recorded_rounds": rounds, "wall_s": round(wall, 1), "device": device,
                               "round_medians_us": shapes}, indent=1) + "\n")
    print(f"recorded {rounds} rounds of {len(shapes)} shapes in {wall:.0f} s -> {out}")


def _as_result(window: dict[str, tuple[list[float], list[float]]], factor: float) -> dict[str, Any]:
    """A runner result of two builds whose per-round medians are the window's (B's divided by `factor`)."""
    shapes = {name: {"builds": {"A": {"ok": True, "round_medians_us": a},
                                "B": {"ok": True, "round_medians_us": [t / factor for t in b]}}}
              for name, (a, b) in window.items()}
    builds = {tag: {"loaded": True, "sha256": tag} for tag in ("A", "B")}
    return {"builds": builds, "shapes": shapes}


def _recorded_rounds(data: dict[str, Any]) -> dict[str, Any]:
    """`record`'s file as it is; a runner result of two builds of one file (an A/A run on a GPU host, e.g.
    results/vllm-kernel-mixed-h200-aa.json) in the same form."""
    if "round_medians_us" in data:
        return data
    tags = list(data["builds"])
    if len(tags) != 2:
        raise SystemExit(f"a runner result of two builds was expected, not {tags}")
    shapes = {name: dict(zip(("A", "A2"), (entry["builds"][t]["round_medians_us"] for t in tags), strict=True))
              for name, entry in data["shapes"].items()}
    return {"recorded_rounds": min(len(s["A"]) for s in shapes.values()), "round_medians_us": shapes}


def resample(recorded: Path, windows: list[int], draws: int, seed: int) -> dict[str, Any]:
    data = _recorded_rounds(json.loads(recorded.read_text()))
    rng = random.Random(seed)
    stats = StatsConfig()
    total = data["recorded_rounds"]
    table: dict[str, Any] = {}
    for w in windows:
        row: dict[str, float] = {}
        for factor in PLANTED:
            accepted = covered = 0
            for _ in range(draws):
                start = rng.randrange(0, total - w + 1)
                flip = rng.random() < 0.5   # which copy plays B
                window: dict[str, tuple[list[float], list[float]]] = {}
                for name, series in data["round_medians_us"].items():
                    a, b = series["A"][start:start + w], series["A2"][start:start + w]
                    window[name] = (b, a) if flip else (a, b)
                ab = compare(_as_result(window, factor), a="A", b="B", stats=stats,
                             expected_sha256={"A": "A", "B": "B"})
                accepted += ab.outcome == "accepted"
                covered += ab.overall is not None and ab.overall.contains(factor)
            row[f"{factor:.2f}"] = round(accepted / draws, 4)
            row[f"covered {factor:.2f}"] = round(covered / draws, 4)
        table[str(w)] = row
        print(f"{w:>3} rounds: accepted (A/A, then B faster by " + ", ".join(f"{f:.2f}x" for f in PLANTED[1:])
              + "): " + "  ".join(f"{row[f'{f:.2f}']:.1%}" for f in PLANTED)
              + f"; the 95 % interval held the true ratio in {row['covered 1.00']:.1%} (A/A)")
    return {"recorded": str(recorded), "draws": draws, "seed": seed, "accept_rate": table}


def live(spec_path: Path, count: int, out: Path | None) -> dict[str, Any]:
    spec = load_kernel_spec(spec_path)
    stats, runs = StatsConfig(), []
    for i in range(count):
        shapes, _ = _aa_evaluation(spec, spec.timing.rounds, seed=100 + i)
        ab = compare(_as_result({n: (s["A"], s["A2"]) for n, s in shapes.items()}, 1.0), a="A", b="B",
                     stats=stats, expected_sha256={"A": "A", "B": "B"})
        assert ab.overall is not None
        runs.append({"outcome": ab.outcome, "overall": ab.overall.ratio, "low": ab.overall.low,
                     "high": ab.overall.high, "reason": ab.reason, "round_medians_us": shapes})
        print(f"{i + 1:>3}/{count}: {ab.outcome:9} {ab.overall}", flush=True)
        if out:   # after every evaluation: an interrupted run keeps what it measured
            out.write_text(json.dumps({"spec": str(spec_path), "spec_timing": spec.timing.model_dump(),
                                       "runs": runs}, indent=1) + "\n")
    accepted = sum(r["outcome"] == "accepted" for r in runs)
    covered = sum(r["low"] <= 1.0 <= r["high"] for r in runs)
    print(f"accepted {accepted}/{count} A/A evaluations; the interval held 1.0 in {covered}/{count}")
    return {"runs": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("spec", type=Path)
    r.add_argument("--rounds", type=int, default=160)
    r.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("resample")
    s.add_argument("recorded", type=Path)
    s.add_argument("--windows", default="4,8,12,20")
    s.add_argument("--draws", type=int, default=2000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path)
    v = sub.add_parser("live")
    v.add_argument("spec", type=Path)
    v.add_argument("--count", type=int, default=40)
    v.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.cmd == "record":
        record(args.spec, args.rounds, args.out)
    elif args.cmd == "live":
        live(args.spec, args.count, args.out)
    else:
        out = resample(args.recorded, [int(x) for x in args.windows.split(",")], args.draws, args.seed)
        if args.out:
            args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
