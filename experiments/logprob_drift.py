"""How far the held prompts' top-k logprobs move under harmless changes and under subtle planted bugs.

Each build gets a fresh server of the spec's model (the embedded trained checkpoint) and generates the
held prompts as parity does; every build is compared with the first ("base") by greedy ids and by the
largest logprob difference (harness/parity.py: max_drift). Harmless: the same build on a fresh server
(A vs A'), batch of one vs batch of all, torch.compile vs eager. Planted: patches that change no greedy
token on a confident checkpoint but are real numeric bugs. The parity tolerance (`parity.logprob_tolerance`)
must sit above the first group and below the second.

    python experiments/logprob_drift.py experiments/gemma4-tiny-cpu.yaml \\
        --out experiments/results/logprob-drift-gemma4-tiny-cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.commands._common import ensure_workspace, make_backend  # noqa: E402
from agent.spec import load_spec  # noqa: E402
from harness.parity import compare, generate, load_prompts  # noqa: E402
from harness.server import serve  # noqa: E402
from sandbox.workspace import Workspace  # noqa: E402

PLANTED = Path(__file__).resolve().parent / "models" / "gemma4-tiny" / "planted"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    spec = load_spec(Path(args.spec))
    ws = ensure_workspace(spec)
    work = ws.root.parent / f"{ws.root.name}.runs" / f"drift-{time.strftime('%Y%m%d-%H%M%S')}"
    prompts = load_prompts(spec.parity.prompts)
    base_args = ws.serving_config()
    builds: list[tuple[str, str, dict[str, object], Path | None, bool]] = [
        ("base", "harmless", base_args, None, False),
        ("base on a fresh server (A vs A')", "harmless", base_args, None, False),
        ("batch of one", "harmless", base_args, None, True),
        ("torch.compile (enforce_eager: false)", "harmless", {**base_args, "enforce_eager": False}, None, False),
        ("PLE token table scaled by 1.1", "planted", base_args, PLANTED / "ple-scale-10pct.patch", False),
        ("exact GELU in the PLE gate", "planted", base_args, PLANTED / "ple-gate-exact-gelu.patch", False),
    ]
    results, reference = [], None
    backend = make_backend(spec)
    for index, (name, group, engine_args, patch, batch_one) in enumerate(builds):
        tree = ws.checkout_copy("HEAD", work / f"tree-{index}")
        try:
            if patch is not None:
                Workspace.open(tree, ws.package).apply_patch(patch.read_text())
            with serve(backend, tree=tree, config=spec.server, engine_args=engine_args,
                       log_path=work / f"server-{index}.log", cache_dir=work / f"cache-{index}") as srv:
                gens = generate(srv.base_url, srv.model_name, prompts, spec.parity,
                                concurrency=1 if batch_one else None)
        finally:
            ws.remove_copy(tree)
        if reference is None:
            reference = gens
            continue
        report = compare(reference, gens)
        row = {"build": name, "group": group, "identical_prompts": len(report.verdicts) - len(report.mismatches),
               "prompts": len(report.verdicts), "max_drift_nats": report.drift.nats if report.drift else None,
               "where": str(report.drift) if report.drift else None}
        results.append(row)
        print(f"{name:45s} {row['identical_prompts']}/{row['prompts']} identical, max drift {row['where']}",
              flush=True)
    harmless = max(r["max_drift_nats"] or 0.0 for r in results if r["group"] == "harmless")
    planted = min(r["max_drift_nats"] or 0.0 for r in results if r["group"] == "planted")
    out = {"spec": spec.name, "engine_args": base_args, "top_logprobs": spec.parity.top_logprobs,
           "max_tokens": spec.parity.max_tokens, "results": results, "max_harmless_nats": harmless,
           "min_planted_nats": planted}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"harmless changes moved logprobs by at most {harmless:.2e} nats; the subtlest planted bug by "
          f"{planted:.2e}; wrote {args.out}")


if __name__ == "__main__":
    main()
