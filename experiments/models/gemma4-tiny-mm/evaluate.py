"""Margins and planted-bug sensitivity of the multimodal checkpoint in vLLM 0.32 CPU.

    .venv/bin/python experiments/models/gemma4-tiny-mm/evaluate.py      # ~6 min: 5 engine starts

Writes experiments/results/gemma4-tiny-mm-eval.json: per prompt kind (text, image) the top-1/top-2 margin
distribution and task accuracy of the held prompts, then for each planted bug of vLLM's image path
(planted/*.patch, applied to an overlay of the installed vllm package) how many prompts of each kind change
their greedy tokens, and the largest logprob drift from the clean run where the tokens still agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "gemma4-tiny"))
from vllm_parity import make_overlay  # noqa: E402

PROMPTS = ROOT / "experiments" / "prompts" / "gemma4-tiny-mm-parity.jsonl"
OUT = ROOT / "experiments" / "results" / "gemma4-tiny-mm-eval.json"


def run(workdir: Path, overlay: Path | None = None) -> dict[str, Any]:
    import os

    out = workdir / ("run-" + (overlay.name if overlay else "clean") + ".json")
    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [env.get("PYTHONPATH")])])
    log = out.with_suffix(".log")
    with log.open("w") as fh:
        rc = subprocess.run([sys.executable, str(HERE / "vllm_run.py"), "--model", str(HERE), "--prompts",
                             str(PROMPTS), "--out", str(out)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                            cwd=workdir, timeout=900).returncode
    if rc != 0:
        raise SystemExit(f"vllm_run.py failed ({rc}); see {log}")
    return json.loads(out.read_text())


def margins(prompts: dict[str, Any], image: bool) -> dict[str, Any]:
    rows = [p for p in prompts.values() if p["image"] == image]
    gaps = sorted(t[0][1] - t[1][1] for p in rows for t in p["top2"])
    q = lambda f: gaps[min(len(gaps) - 1, int(f * len(gaps)))]  # noqa: E731 - nearest-rank quantile
    right = sum(p["token_ids"] == p["expected"] for p in rows)
    return {"prompts": len(rows), "positions": len(gaps), "min": round(gaps[0], 3), "p1": round(q(0.01), 3),
            "p5": round(q(0.05), 3), "median": round(q(0.5), 3),
            "share_ge_1nat": round(sum(g >= 1 for g in gaps) / len(gaps), 4), "task_correct": right}


def changed(clean: dict[str, Any], bug: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"text": 0, "image": 0, "max_drift_nats": 0.0}
    for pid, ref in clean.items():
        got = bug[pid]
        if got["token_ids"] != ref["token_ids"]:
            out["image" if ref["image"] else "text"] += 1
        for a, b, ta, tb in zip(ref["token_ids"], got["token_ids"], ref["top2"], got["top2"], strict=True):
            theirs = dict((t, lp) for t, lp in tb)
            for t, lp in ta:
                if t in theirs:
                    out["max_drift_nats"] = max(out["max_drift_nats"], round(abs(lp - theirs[t]), 6))
            if a != b:
                break
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="mm-eval-"))
    clean = run(work)
    report: dict[str, Any] = {"command": "python experiments/models/gemma4-tiny-mm/evaluate.py",
                              "prompts": str(PROMPTS.relative_to(ROOT)), "engine_start_s": clean["engine_start_s"],
                              "margins": {"text": margins(clean["prompts"], False),
                                          "image": margins(clean["prompts"], True)}, "planted": {}}
    print(json.dumps(report["margins"]), flush=True)
    for patch in sorted((HERE / "planted").glob("*.patch")):
        overlay = make_overlay(patch, work / patch.stem)
        bug = run(work, overlay)
        if bug["gemma4_mm_sha256"] == clean["gemma4_mm_sha256"]:
            raise SystemExit(f"{patch.name}: the overlay's gemma4_mm.py was not the one imported")
        report["planted"][patch.stem] = {**changed(clean["prompts"], bug["prompts"]),
                                         "imported": bug["gemma4_mm_file"]}
        print(patch.stem, json.dumps(report["planted"][patch.stem]), flush=True)
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
