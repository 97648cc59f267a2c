"""Server start-up with a warm vs a cold compile cache, for one build, side by side in one run.

Campaigns key each server's cache folder (HOME, VLLM_CACHE_ROOT) by the build's content
(`harness.measure.cache_dir_for`), so an A that is the baseline's tree, or the last accepted candidate's,
finds their torch.compile artefacts. Before, every A and B had a folder per tag and A recompiled. This
measures what that saves on a compiled server (enforce_eager off): one priming start fills the warm folder,
then warm and cold starts alternate (cold = a fresh folder each time): cold, warm, cold, warm, ...

    python experiments/compile_cache_startup.py [SPEC] [--starts 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from agent.spec import load_spec
from harness.server import serve
from sandbox.factory import backend_from_config
from sandbox.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "experiments" / "gemma4-tiny-cpu.yaml"))
    parser.add_argument("--starts", type=int, default=5, help="servers started in all (at least 2)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spec = load_spec(Path(args.spec))
    engine_args = {**spec.server.engine_args, "enforce_eager": False}
    backend = backend_from_config(spec.sandbox)
    with tempfile.TemporaryDirectory(prefix="ratchet-cache-") as tmp:
        work = Path(tmp)
        ws = Workspace.create(work / "ws", serving=engine_args, package=spec.target.package,
                              source=spec.target_source())
        starts: dict[str, list[float]] = {"cold": [], "warm": []}

        def start(kind: str, cache: Path) -> None:
            with serve(backend, tree=ws.root, config=spec.server, engine_args=engine_args,
                       log_path=work / f"server-{kind}-{len(starts[kind])}.log", cache_dir=cache) as srv:
                starts[kind].append(round(srv.startup_s, 1))
            print(f"{kind}: {starts[kind][-1]} s", flush=True)

        start("cold", work / "warm")                      # primes the warm folder; a cold start itself
        for i in range(1, max(args.starts, 2)):
            if i % 2:
                start("warm", work / "warm")
            else:
                start("cold", work / f"cold-{i}")
    cold, warm = statistics.median(starts["cold"]), statistics.median(starts["warm"])
    summary = {"spec": spec.name, "engine_args": engine_args, "starts_s": starts, "cold_median_s": cold,
               "warm_median_s": warm, "saved_s": round(cold - warm, 1), "warm_over_cold": round(warm / cold, 3),
               "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
