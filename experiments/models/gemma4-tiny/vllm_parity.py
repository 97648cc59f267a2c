"""Run vLLM on a prompt set in a subprocess, build patched vLLM overlays, compare greedy outputs.

Shared by evaluate.py and tests/model/. Nothing here imports vLLM: each engine lives in its own
``vllm_run.py`` subprocess (its own process group, killed on timeout), so a crash or a hang is
reported as an error naming the log, never a stuck test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PYTHON = sys.executable

__all__ = ["compare", "gap_stats", "make_overlay", "run_vllm"]


def run_vllm(model: Path, prompts: Path, *, compiled: bool, batch_one: bool, workdir: Path,
             overlay: Path | None = None, timeout_s: float = 900) -> dict[str, Any]:
    """One engine start; returns vllm_run.py's report. ``overlay`` is put first on PYTHONPATH."""
    tag = ("compiled" if compiled else "eager") + ("-overlay" if overlay else "")
    out, log = workdir / f"vllm-{tag}.json", workdir / f"vllm-{tag}.log"
    argv = [PYTHON, str(HERE / "vllm_run.py"), "--model", str(model), "--prompts", str(prompts),
            "--out", str(out)] + (["--compiled"] if compiled else []) + (["--batch-one"] if batch_one else [])
    env = dict(os.environ)
    if overlay is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(overlay), *filter(None, [env.get("PYTHONPATH")])])
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(workdir),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"vllm_run.py ({tag}) exceeded {timeout_s:.0f} s; see {log}") from None
    if rc != 0 or not out.exists():
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"vllm_run.py ({tag}) exited {rc}; last lines of {log}:\n{tail}")
    return json.loads(out.read_text())


def _installed_vllm() -> Path:
    """The installed vllm package directory, found without importing vllm (slow, side effects)."""
    out = subprocess.run([PYTHON, "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip()).parent


def make_overlay(patch: Path, dest: Path) -> Path:
    """A whole ``vllm`` package under ``dest`` (symlinks to the installed files, real copies along the
    patched files' paths), with ``patch`` applied by ``git apply``. Returns ``dest`` for PYTHONPATH.

    A package cannot be shadowed partially, so the overlay holds every entry; only the directories
    on the way to a patched file are real, so the 500 MB of compiled extensions are never copied.
    """
    pkg = _installed_vllm()
    targets = [line[len("+++ b/"):].strip() for line in patch.read_text().splitlines()
               if line.startswith("+++ b/")]
    for rel in targets:
        parts = Path(rel).parts
        if parts[0] != "vllm":
            raise ValueError(f"{patch}: path {rel} is outside the vllm package")
        src_dir, dst_dir = pkg, dest / "vllm"
        for depth, name in enumerate(parts[1:], start=1):
            dst_dir.mkdir(parents=True, exist_ok=True)
            for entry in src_dir.iterdir():  # mirror this level with symlinks, once
                link = dst_dir / entry.name
                if not link.exists() and not link.is_symlink() and entry.name != "__pycache__":
                    link.symlink_to(entry)
            nxt = dst_dir / name
            if nxt.is_symlink():
                nxt.unlink()
                if depth == len(parts) - 1:
                    shutil.copy2(src_dir / name, nxt)  # the file to patch: a real copy
            src_dir, dst_dir = src_dir / name, nxt
    # Outside any repository, git apply takes the patch's paths relative to cwd; the ceiling keeps
    # git from discovering an enclosing repository (which would re-root the paths there).
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(dest.resolve().parent))
    for argv in (["git", "apply", "--check", str(patch.resolve())], ["git", "apply", str(patch.resolve())]):
        subprocess.run(argv, cwd=dest, env=env, check=True, timeout=60)
    return dest


def compare(ref: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Exact token-id parity per prompt; on a flip, the first differing position and ref's margin there."""
    changed: list[dict[str, Any]] = []
    for pid, r in ref.items():
        o = other[pid]["token_ids"]
        k = next((i for i, (a, b) in enumerate(zip(r["token_ids"], o, strict=True)) if a != b), None)
        if k is not None:
            t = r["top2"][k]
            changed.append({"id": pid, "pos": k, "ref": r["token_ids"][k], "got": o[k],
                            "ref_margin": round(t[0][1] - t[1][1], 3)})
    n = len(ref)
    return {"prompts": n, "identical": n - len(changed), "changed": len(changed),
            "changed_frac": round(len(changed) / n, 4), "flips": changed}


def gap_stats(result: dict[str, Any]) -> dict[str, float]:
    """Top-1/top-2 logprob gap (nats) over every generated position of every prompt."""
    gaps = sorted(t[0][1] - t[1][1] for r in result.values() for t in r["top2"])
    q = lambda f: gaps[min(len(gaps) - 1, int(f * len(gaps)))]  # noqa: E731 - nearest-rank quantile
    return {"positions": len(gaps), "min": round(gaps[0], 4), "p1": round(q(0.01), 4),
            "p5": round(q(0.05), 4), "median": round(q(0.5), 4),
            "frac_ge_1nat": round(sum(g >= 1.0 for g in gaps) / len(gaps), 4)}


def scratch_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
