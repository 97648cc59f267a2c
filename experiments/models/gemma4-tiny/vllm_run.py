"""Greedy-decode a prompt set with vLLM (CPU) in one process; print one JSON object on stdout's last line.

    .venv/bin/python experiments/models/gemma4-tiny/vllm_run.py --model DIR --prompts FILE.jsonl \
        [--compiled] [--batch-one] --out RESULT.json

One engine start per call (each costs ~30 s eager / ~100 s compiled here), so a call runs the
batch-of-all pass and, with --batch-one, the batch-of-1 pass on the same engine. Meant to be run as
a subprocess (vLLM spawns workers; hence the __main__ guard). Output per pass: for each prompt id
the generated token ids and, per position, the top-2 (token id, logprob) pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

NEW_TOKENS = 64


def decode_all(llm: Any, prompts: list[dict[str, Any]], *, one_by_one: bool) -> dict[str, Any]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=2, ignore_eos=True)
    inputs = [{"prompt_token_ids": p["prompt_token_ids"]} for p in prompts]
    if one_by_one:
        outs = [llm.generate([x], sp, use_tqdm=False)[0] for x in inputs]
    else:
        outs = llm.generate(inputs, sp, use_tqdm=False)
    result: dict[str, Any] = {}
    for p, o in zip(prompts, outs, strict=True):
        c = o.outputs[0]
        top2 = []
        for pos_lp in c.logprobs:
            # Sorted by logprob: vLLM adds the sampled token to the top-k dict, so take the best two.
            pairs = sorted(((int(t), float(lp.logprob)) for t, lp in pos_lp.items()), key=lambda x: -x[1])
            top2.append(pairs[:2])
        result[p["id"]] = {"token_ids": list(c.token_ids), "top2": top2}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--compiled", action="store_true", help="enforce_eager=False (torch.compile)")
    ap.add_argument("--batch-one", action="store_true", help="also decode the prompts one at a time")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    # A small KV cache is plenty for <= 64 prompts of <= 224 tokens, and leaves RAM to the others.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM

    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    llm = LLM(model=str(args.model), skip_tokenizer_init=True, enforce_eager=not args.compiled,
              enable_prefix_caching=False, dtype="float32", gpu_memory_utilization=0.3, seed=0)
    start_s = time.perf_counter() - t0
    import hashlib

    import vllm
    import vllm.model_executor.models.gemma4 as g4

    # Evidence of which code ran: a patched overlay shows its own path and file hash here.
    g4_file = Path(g4.__file__)
    report: dict[str, Any] = {"vllm_version": vllm.__version__, "vllm_file": vllm.__file__,
                              "gemma4_file": str(g4_file),
                              "gemma4_sha256": hashlib.sha256(g4_file.read_bytes()).hexdigest(),
                              "compiled": args.compiled, "engine_start_s": round(start_s, 1)}
    report["batch_all"] = decode_all(llm, prompts, one_by_one=False)
    if args.batch_one:
        report["batch_one"] = decode_all(llm, prompts, one_by_one=True)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(report))
    print(json.dumps({"ok": True, "out": str(args.out), "engine_start_s": report["engine_start_s"]}))


if __name__ == "__main__":
    main()
