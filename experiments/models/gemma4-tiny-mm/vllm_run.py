"""Greedy-decode the multimodal prompt set with vLLM (CPU) in one process; print one JSON line at the end.

    .venv/bin/python experiments/models/gemma4-tiny-mm/vllm_run.py --model DIR --prompts FILE.jsonl --out R.json

Text prompts go in as token ids; reading prompts as their token ids (one `<|image|>` placeholder, which vLLM's
Gemma 4 processor expands) with the picture of their `content`. Per prompt: the generated ids and, per
position, the top-2 (token id, logprob) pairs. Run as a subprocess (vLLM spawns workers).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import time
from pathlib import Path
from typing import Any

NEW_TOKENS = 64


def picture(prompt: dict[str, Any]) -> Any:
    from PIL import Image

    url = next(p["image_url"]["url"] for p in prompt["content"] if p["type"] == "image_url")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    t0 = time.perf_counter()
    llm = LLM(model=str(args.model), enforce_eager=True, enable_prefix_caching=False, dtype="float32",
              gpu_memory_utilization=0.3, seed=0, max_model_len=4096,
              limit_mm_per_prompt={"image": 1, "video": 0})
    start_s = time.perf_counter() - t0
    import hashlib

    import vllm.model_executor.models.gemma4_mm as mm

    inputs = []
    for p in prompts:
        item: dict[str, Any] = {"prompt_token_ids": p["prompt_token_ids"]}
        if p.get("content"):
            item["multi_modal_data"] = {"image": picture(p)}
        inputs.append(item)
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=2, ignore_eos=True)
    outs = llm.generate(inputs, sp, use_tqdm=False)
    result: dict[str, Any] = {}
    for p, o in zip(prompts, outs, strict=True):
        c = o.outputs[0]
        top2 = [sorted(((int(t), float(lp.logprob)) for t, lp in pos.items()), key=lambda x: -x[1])[:2]
                for pos in c.logprobs]
        result[p["id"]] = {"token_ids": list(c.token_ids), "top2": top2, "image": bool(p.get("content")),
                           "expected": p.get("expected_token_ids")}
    mm_file = Path(mm.__file__)
    report = {"gemma4_mm_file": str(mm_file), "gemma4_mm_sha256": hashlib.sha256(mm_file.read_bytes()).hexdigest(),
              "engine_start_s": round(start_s, 1), "total_s": round(time.perf_counter() - t0, 1), "prompts": result}
    args.out.write_text(json.dumps(report))
    print(json.dumps({"ok": True, "out": str(args.out), "engine_start_s": report["engine_start_s"]}))


if __name__ == "__main__":
    main()
