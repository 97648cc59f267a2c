"""Server start-up with a warm vs a cold compile cache, for one build, side by side in one run.

Campaigns key each server's cache folder (HOME, VLLM_CACHE_ROOT) by the build's content
(`harness.measure.cache_dir_for`), so an A that is the baseline's tree, or the last accepted candidate's,
finds their torch.compile artefacts. Before, every A and B had a folder per tag and A recompiled. This
measures what that saves on a compiled server (enforce_eager off): one priming start fills the warm folder,
then warm and cold starts alternate (cold = a fresh folder each time): cold, warm, cold, warm, ...

With `--variant KEY=VALUE` (engine args a candidate changes, the code unchanged) the comparison is the one a
campaign's serving-only candidate meets: after the priming start with the spec's args, starts of the variant
rotate between `seeded` (a fresh folder started as a copy of the primed one: harness.measure.seed_cache, as a
campaign does) and `cold` (a fresh, empty folder), with the primed args' `warm` start alongside.

    python experiments/compile_cache_startup.py [SPEC] [--starts 5] [--variant stream_interval=4]
        [--backend bwrap] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from agent.spec import load_spec
from harness.measure import Build, seed_cache
from harness.server import serve
from sandbox.factory import backend_from_config
from sandbox.workspace import Workspace

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "experiments" / "gemma4-tiny-cpu.yaml"))
    parser.add_argument("--starts", type=int, default=5, help="servers started in all (at least 2)")
    parser.add_argument("--variant", metavar="KEY=VALUE", help="engine args alone changed: seeded vs cold starts")
    parser.add_argument("--backend", choices=("bwrap", "unisolated", "docker"), help="instead of the spec's")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spec = load_spec(Path(args.spec))
    engine_args = {**spec.server.engine_args, "enforce_eager": False}
    sandbox = spec.sandbox.model_copy(update={"backend": args.backend}) if args.backend else spec.sandbox
    backend = backend_from_config(sandbox)
    if args.variant:
        key, _, value = args.variant.partition("=")
        variant = {**engine_args, key: json.loads(value)}
        return seeded_vs_cold(spec, backend, engine_args, variant, max(args.starts, 4), args.out,
                              str(sandbox.backend))
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


def seeded_vs_cold(spec, backend, engine_args: dict, variant: dict, starts_in_all: int, out: Path | None,
                   backend_name: str) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory(prefix="ratchet-cache-") as tmp:
        work = Path(tmp)
        ws = Workspace.create(work / "ws", serving=engine_args, package=spec.target.package,
                              source=spec.target_source())
        code = ws.code_hash("HEAD")
        incumbent = Build(tag="A", tree=ws.root, engine_args=engine_args, cache_key="primed", code_key=code)
        candidate = Build(tag="B", tree=ws.root, engine_args=variant, cache_key="variant", code_key=code)
        starts: dict[str, list[float]] = {"primed": [], "seeded": [], "cold": [], "warm": []}

        def start(kind: str, args: dict, cache: Path) -> None:
            with serve(backend, tree=ws.root, config=spec.server, engine_args=args,
                       log_path=work / f"server-{kind}-{len(starts[kind])}.log", cache_dir=cache) as srv:
                starts[kind].append(round(srv.startup_s, 1))
            print(f"{kind}: {starts[kind][-1]} s", flush=True)

        primed = work / "primed"
        start("primed", engine_args, primed)
        for i in range(1, starts_in_all):
            kind = ("seeded", "cold", "warm")[(i - 1) % 3]
            if kind == "seeded":
                folder = work / f"seeded-{i}"
                assert seed_cache(incumbent, primed, candidate, folder)
                start(kind, variant, folder)
            elif kind == "cold":
                start(kind, variant, work / f"cold-{i}")
            else:
                start(kind, engine_args, primed)
    medians = {k: statistics.median(v) for k, v in starts.items() if v}
    summary = {"spec": spec.name, "backend": backend_name, "engine_args": engine_args,
               "variant": {k: v for k, v in variant.items() if engine_args.get(k) != v}, "starts_s": starts,
               "median_s": medians,
               "seeded_over_cold": round(medians["seeded"] / medians["cold"], 3) if "cold" in medians else None,
               "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(summary, indent=1)
    if out:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
