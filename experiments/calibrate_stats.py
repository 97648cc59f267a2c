"""Calibration of ratchet's accept rule on recorded data (issue 14): does a "95 %" verdict mean 95 %?

  record   a long A/A run of a spec: the same build on both sides, N interleaved pairs per cell, through
           `ratchet compare` (fresh servers, the shipped measurement path)
  resample cut a long run into thousands of campaign-sized comparisons and count how often the accept rule
           accepts: on A/A data that is the false-accept rate; with a planted effect (B's throughput
           multiplied by 1.05, 1.10) or on a recorded real effect, it is the power
  live     N campaign-sized no-op comparisons, each on fresh servers (what a campaign's A/B really is:
           server instances differ, which one long run cannot show)

    python experiments/calibrate_stats.py record experiments/gemma4-tiny-cpu.yaml --repeats 30 \\
        --out experiments/results/aa-long-gemma4-tiny-cpu.json
    python experiments/calibrate_stats.py resample experiments/results/aa-long-gemma4-tiny-cpu.json \\
        --out experiments/results/calibration-gemma4-tiny-cpu.json
    python experiments/calibrate_stats.py live experiments/gemma4-tiny-cpu.yaml --count 20 \\
        --out experiments/results/live-noop-gemma4-tiny-cpu.json

A campaign-sized comparison keeps the recorded order structure: its i-th pair is drawn from recorded
repeats of the same parity as i (so every cell keeps its A-first/B-first alternation), and each one is
taken in a random orientation (A/B or B/A). "Before" is the rule ratchet shipped until this change
(percentile/BCa bootstrap, 3 repeats), re-implemented here to measure it; "after" is harness/stats.py.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scistats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.config import StatsConfig  # noqa: E402
from harness.stats import SpeedupCI, decide, overall_ci, speedup_ci  # noqa: E402

HEADLINE = {True: "prefill_tok_s", False: "total_token_throughput"}


def _grid(samples: list[dict[str, Any]]) -> tuple[list[str], np.ndarray]:
    """cells x repeats of the headline metric, cells in recorded order."""
    cells: list[str] = []
    for s in samples:
        if s["cell"] not in cells:
            cells.append(s["cell"])
    repeats = 1 + max(int(s["repeat"]) for s in samples)
    out = np.full((len(cells), repeats), np.nan)
    for s in samples:
        out[cells.index(s["cell"]), int(s["repeat"])] = s[HEADLINE[s["cell"].endswith("/out1")]]
    if np.isnan(out).any():
        raise SystemExit("the recording has missing (cell, repeat) samples")
    return cells, out


# -- the rule before this change, kept here only to measure it --------------------------------------------
def _old_cell_ci(a: np.ndarray, b: np.ndarray, cfg: StatsConfig, rng: np.random.Generator) -> SpeedupCI:
    ratio = float(b.mean() / a.mean())

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(y, axis=axis) / np.mean(x, axis=axis)

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = scistats.bootstrap((a, b), stat, paired=True, vectorized=True, confidence_level=cfg.confidence,
                                     n_resamples=1000, method=method, random_state=rng)
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return SpeedupCI(ratio, min(low, ratio), max(high, ratio), a.size)
    return SpeedupCI(ratio, ratio, ratio, a.size)


def _old_overall(a: np.ndarray, b: np.ndarray, cfg: StatsConfig, rng: np.random.Generator) -> SpeedupCI:
    n = a.shape[1]

    def geo(idx: np.ndarray) -> float:
        idx = idx.astype(int)
        return float(np.exp(np.mean(np.log(b[:, idx].mean(axis=1) / a[:, idx].mean(axis=1)))))

    ratio = geo(np.arange(n))
    res = scistats.bootstrap((np.arange(n, dtype=float),), geo, vectorized=False, method="percentile",
                             confidence_level=cfg.confidence, n_resamples=1000, random_state=rng)
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return SpeedupCI(ratio, min(low, ratio), max(high, ratio), n)


def _old_decide(overall: SpeedupCI, cells: dict[str, SpeedupCI], cfg: StatsConfig) -> bool:
    if overall.ratio > cfg.plausibility_ceiling:
        return False
    if any(ci.high < cfg.cell_guard for ci in cells.values()):
        return False
    return overall.low >= cfg.accept_lower_bound


# -- one campaign-sized comparison -------------------------------------------------------------------------
def _verdicts(labels: list[str], a: np.ndarray, b: np.ndarray, cfg: StatsConfig, *, old: bool,
              rng: np.random.Generator, stage: str = "confirm", confirm_pairs: int | None = None
              ) -> tuple[bool, SpeedupCI]:
    if old:
        cells = {k: _old_cell_ci(a[i], b[i], cfg, rng) for i, k in enumerate(labels)}
        overall = _old_overall(a, b, cfg, rng)
        return _old_decide(overall, cells, cfg), overall
    cells = {k: speedup_ci(list(a[i]), list(b[i]), cfg) for i, k in enumerate(labels)}
    overall = overall_ci({k: list(a[i]) for i, k in enumerate(labels)},
                         {k: list(b[i]) for i, k in enumerate(labels)}, cfg)
    return decide(overall, cells, cfg, stage=stage, confirm_pairs=confirm_pairs).accept, overall


def _draw(rng: np.random.Generator, repeats: int, n: int, exclude: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """n recorded repeats, the i-th of the same parity as i (keeps every cell's A-first/B-first order)."""
    pools = {p: [r for r in range(repeats) if r % 2 == p and r not in exclude] for p in (0, 1)}
    picks = {p: list(rng.choice(pools[p], size=(n + 1 - p) // 2, replace=False)) for p in (0, 1)}
    return [int(picks[i % 2].pop()) for i in range(n)]


def resample(args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(Path(args.recording).read_text())
    labels, a_all = _grid(data["samples"]["A"])
    labels_b, b_all = _grid(data["samples"]["B"])
    assert labels == labels_b
    cfg = StatsConfig()
    rng = np.random.default_rng(args.seed)
    repeats = a_all.shape[1]
    out: dict[str, Any] = {"recording": args.recording, "recorded_repeats": repeats, "cells": labels,
                           "trials": args.trials, "seed": args.seed, "stats": cfg.model_dump(), "rules": {}}
    full = overall_ci({k: list(a_all[i]) for i, k in enumerate(labels)},
                      {k: list(b_all[i]) for i, k in enumerate(labels)}, cfg)
    out["whole_recording"] = {"overall": str(full), "ratio": full.ratio}
    effects = [1.0, *args.effects]
    # (name, screen repeats, screen stage, confirmation repeats or 0, old rule)
    rules = [("before: bootstrap, 3 repeats, no confirmation", 3, "confirm", 0, True),
             ("bootstrap at 4 repeats, no confirmation", 4, "confirm", 0, True),
             *((f"Student-t, {k} repeats, no confirmation", k, "confirm", 0, False) for k in args.repeats),
             ("Student-t strict at 4, confirmed strict at 4", 4, "confirm", 4, False),
             ("screen at 4 (80 % lower bound >= 1.0), confirmed strict at 8", 4, "screen", 8, False),
             ("shipped: screen at 4 (80 % lower bound >= 1.0, confirmation's chance >= "
              f"{cfg.screen_confirm_chance:.0%}), confirmed strict at 8", 4, "screen+chance", 8, False)]
    rules = [rule for rule in rules if not args.only or any(word in rule[0] for word in args.only)]
    for name, n, stage, n_confirm, old in rules:
        t0 = time.monotonic()
        rule: dict[str, Any] = {"repeats": n, "screen": stage, "confirm_repeats": n_confirm, "accept_rate": {},
                                "covers_one": None}
        trials = args.trials if not old else min(args.trials, args.old_trials)
        for effect in effects:
            accepted = covered = confirmed = 0
            for _ in range(trials):
                idx = _draw(rng, repeats, n)
                base, cand = (a_all, b_all) if rng.random() < 0.5 else (b_all, a_all)   # either side
                ok, overall = _verdicts(labels, base[:, idx], cand[:, idx] * effect, cfg, old=old, rng=rng,
                                        stage=stage.removesuffix("+chance"),
                                        confirm_pairs=n_confirm if stage.endswith("+chance") else None)
                accepted += ok
                covered += overall.contains(effect)
                if ok and n_confirm:   # an independent confirmation: disjoint recorded repeats, either side
                    idx2 = _draw(rng, repeats, n_confirm, exclude=set(idx))
                    base, cand = (a_all, b_all) if rng.random() < 0.5 else (b_all, a_all)
                    ok2, _ = _verdicts(labels, base[:, idx2], cand[:, idx2] * effect, cfg, old=False, rng=rng)
                    confirmed += ok2
            key = f"{effect:.2f}"
            rule["accept_rate"][key] = accepted / trials
            if n_confirm:
                rule.setdefault("committed_rate", {})[key] = confirmed / trials
            if effect == 1.0:
                rule["covers_one"] = covered / trials
        rule["trials"] = trials
        rule["seconds"] = round(time.monotonic() - t0, 1)
        out["rules"][name] = rule
        print(f"{name}: " + ", ".join(f"passes@{k} {v:.1%}" for k, v in rule["accept_rate"].items())
              + ("; committed " + ", ".join(f"@{k} {v:.2%}" for k, v in rule["committed_rate"].items())
                 if n_confirm else "")
              + f"; its 95% interval covers 1.0 in {rule['covers_one']:.1%}", flush=True)
    return out


def record(args: argparse.Namespace) -> None:
    ratchet = Path(sys.executable).parent / "ratchet"
    argv = [str(ratchet), "compare", args.spec, "--baseline", "HEAD", "--candidate", "HEAD",
            "--repeats", str(args.repeats), "--out", args.out]
    if args.engine_args:
        argv += ["--engine-args", args.engine_args]
    print(" ".join(argv), flush=True)
    raise SystemExit(subprocess.call(argv))


def live(args: argparse.Namespace) -> None:
    """N fresh-server no-op comparisons at the spec's own size; each one's verdict and overall interval."""
    ratchet = Path(sys.executable).parent / "ratchet"
    results: list[dict[str, Any]] = []
    out = Path(args.out)
    if out.exists():
        results = json.loads(out.read_text())["comparisons"]
    for k in range(len(results), args.count):
        tmp = out.with_suffix(f".{k}.json")
        subprocess.run([str(ratchet), "compare", args.spec, "--baseline", "HEAD", "--candidate", "HEAD",
                        "--out", str(tmp)], check=True)
        ab = json.loads(tmp.read_text())
        cfg = StatsConfig()
        cells = {label: SpeedupCI(**{f: per["headline"][f] for f in ("ratio", "low", "high", "n", "se_log", "df")})
                 for label, per in ab["cells"].items()}
        overall = SpeedupCI(**{f: ab["overall"][f] for f in ("ratio", "low", "high", "n", "se_log", "df")})
        verdict = decide(overall, cells, cfg)
        results.append({"overall": str(overall), "accept": verdict.accept, "reason": verdict.reason,
                        "wall_s": ab["wall_s"]})
        tmp.unlink()
        out.write_text(json.dumps({"spec": args.spec, "comparisons": results}, indent=1) + "\n")  # after each
        print(f"live no-op {k + 1}/{args.count}: {overall} accept={verdict.accept}", flush=True)
    accepted = sum(r["accept"] for r in results)
    print(f"{accepted} of {len(results)} live no-op comparisons accepted")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("spec")
    r.add_argument("--repeats", type=int, default=30)
    r.add_argument("--engine-args", help="JSON: the candidate's engine args (a real effect, e.g. one that starves B)")
    r.add_argument("--out", required=True)
    s = sub.add_parser("resample")
    s.add_argument("recording")
    s.add_argument("--trials", type=int, default=4000)
    s.add_argument("--old-trials", type=int, default=1000, help="the bootstrap rule is slow: fewer trials")
    s.add_argument("--repeats", type=int, nargs="+", default=[4, 6])
    s.add_argument("--effects", type=float, nargs="+", default=[1.05, 1.10])
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--only", nargs="+", help="only the rules whose name contains one of these words")
    s.add_argument("--out")
    lv = sub.add_parser("live")
    lv.add_argument("spec")
    lv.add_argument("--count", type=int, default=20)
    lv.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd == "record":
        record(args)
    elif args.cmd == "live":
        live(args)
    else:
        out = resample(args)
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
