"""Train the E2B-shaped parity checkpoint on a GPU host, from a seed, in about six minutes on one H200.

    python3 experiments/models/gemma4-e2b-shaped/train.py [--out DIR]    # default: this folder

Writes DIR/model.safetensors (bf16, ~1 GB, git-ignored: it is made where it is used) and DIR/training.json
(the command, the loss curve, and the checks below). config.json and the tokenizer are committed (task.py).

What it checks, on fresh sequences with bf16 weights (what vLLM serves), teacher-forced:
- accuracy and top-1/top-2 margins (nats) of the copy positions per mode, at the training length and far past it
  (up to the E2B grid's 8,192 + 256), so the held prompts at the grid's lengths are confident ones;
- sensitivity: for each part a patch may touch (sliding and full attention, KV-shared layers, PLE table and
  projection, norms, MLP) a 10 % change of one scale, and how far it moves the logprobs and how many greedy
  tokens it flips; a part that moves nothing would make parity blind to bugs there.
GPU training is not bit-for-bit deterministic: a host trains its own copy, and a campaign records the checkpoint's
hash with the parity reference it records from it, so A and B are always judged on the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from task import HERE, LAYER_TYPES, MAX_POSITIONS, NUM_KV_SHARED, config_dict, make_batch, write_static_files

sys.path.insert(0, str(HERE.parent / "gemma4-tiny"))
from add_shared_kv_norms import add_shared_kv_norms  # noqa: E402

TRAIN_LEN = 1536  # 2.5 windows, and two and a half long periods
LONG_LEN = 8512  # the grid's longest input + output (8,448), rounded up


def build_model(cfg: dict[str, Any], seed: int, device: str) -> torch.nn.Module:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig.from_dict(cfg)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(config).to(device=device, dtype=torch.float32)
    # As in the tiny checkpoint: a PLE table at unit RMS after its scale keeps PLE in play (default init makes
    # it negligible next to the context projection, and a model trained from it ignores the table).
    ple = model.model.embed_tokens_per_layer
    torch.nn.init.normal_(ple.weight, std=config.hidden_size_per_layer_input**-0.5)
    return model


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def autocast(device: str) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def train(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    history: list[dict[str, float]] = []
    t0 = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        # Every `long_every`-th step is one long batch at the grid's full length, so the full layers learn
        # to fetch across 8k positions, not only across the training length.
        long = args.long_every > 0 and step % args.long_every == args.long_every - 1
        x, mask = make_batch(args.long_batch if long else args.batch, args.long_len if long else args.seq_len, gen)
        x, mask = x.to(args.device), mask.to(args.device)
        with autocast(args.device):
            logits = model(input_ids=x).logits[:, :-1]
        m = mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[m].float(), x[:, 1:][m])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            rec = {"step": step, "loss": round(loss.item(), 5), "long": long,
                   "wall_s": round(time.perf_counter() - t0, 1)}
            history.append(rec)
            print(json.dumps(rec), flush=True)
    return {"wall_s": round(time.perf_counter() - t0, 1), "history": history}


@torch.no_grad()
def logprobs(model: torch.nn.Module, x: torch.Tensor, chunk: int) -> torch.Tensor:
    return torch.cat([torch.log_softmax(model(input_ids=x[i:i + chunk]).logits[:, :-1].float(), -1)
                      for i in range(0, len(x), chunk)])


def margins(logp: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Accuracy and top-1/top-2 margins of the copy positions, overall and per mode (even rows short)."""
    top2 = logp.topk(2, -1)
    m = mask[:, 1:]
    correct = (top2.indices[..., 0] == x[:, 1:]) & m
    gap = (top2.values[..., 0] - top2.values[..., 1])[m]
    out: dict[str, Any] = {
        "positions": int(m.sum()), "acc": round(correct.sum().item() / m.sum().item(), 5),
        "gap_min": round(gap.min().item(), 3), "gap_p1": round(gap.quantile(0.01).item(), 3),
        "gap_median": round(gap.median().item(), 3), "frac_gap_ge_1": round((gap >= 1.0).float().mean().item(), 5)}
    for name, rows in (("short", slice(0, None, 2)), ("mixed", slice(1, None, 2))):
        out[f"acc_{name}"] = round(correct[rows].sum().item() / max(1, m[rows].sum().item()), 5)
    return out


def parts(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One scale per part a patch may touch (the tensor a 10 % change multiplies)."""
    layers = model.model.layers
    first_full = LAYER_TYPES.index("full_attention")
    last_sliding = len(LAYER_TYPES) - 2  # KV-shared, sliding
    shared_full = len(LAYER_TYPES) - 1  # KV-shared, full
    return {
        "sliding attention (layer 0 o_proj)": layers[0].self_attn.o_proj.weight,
        f"full attention (layer {first_full} o_proj)": layers[first_full].self_attn.o_proj.weight,
        f"KV-shared sliding layer ({last_sliding} o_proj)": layers[last_sliding].self_attn.o_proj.weight,
        f"KV-shared full layer ({shared_full} o_proj)": layers[shared_full].self_attn.o_proj.weight,
        "PLE token table": model.model.embed_tokens_per_layer.weight,
        "PLE projection": model.model.per_layer_model_projection.weight,
        f"q norm (layer {first_full})": layers[first_full].self_attn.q_norm.weight,
        "post-feed-forward norm (layer 1)": layers[1].post_feedforward_layernorm.weight,
        "MLP (layer 1 down_proj)": layers[1].mlp.down_proj.weight,
        f"double-wide MLP (layer {shared_full} down_proj)": layers[shared_full].mlp.down_proj.weight,
    }


@contextlib.contextmanager
def scaled(t: torch.Tensor, factor: float) -> Iterator[None]:
    saved = t.detach().clone()
    t.data.mul_(factor)
    try:
        yield
    finally:
        t.data.copy_(saved)


@torch.no_grad()
def sensitivity(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor, chunk: int) -> list[dict[str, Any]]:
    base = logprobs(model, x, chunk)
    m = mask[:, 1:]
    rows = []
    for name, t in parts(model).items():
        # Gemma's RMS norms scale by (1 + weight) in some versions and by weight in others: perturb the
        # effective scale either way by scaling the stored weight, which is what a patch would change.
        with scaled(t, 1.1):
            lp = logprobs(model, x, chunk)
        drift = (lp - base).abs().amax(-1)[m]
        flips = (lp.argmax(-1) != base.argmax(-1))[m]
        rows.append({"part": name, "max_logprob_drift": round(drift.max().item(), 4),
                     "mean_logprob_drift": round(drift.mean().item(), 5), "greedy_flips": int(flips.sum())})
    return rows


def evaluate(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    model.eval()
    model.to(torch.bfloat16)  # what the E2B specs serve
    gen = torch.Generator().manual_seed(12345)
    by_length = {}
    for length, batch in ((args.seq_len, 16), *((n, max(2, 16384 // n)) for n in args.eval_lengths)):
        x, mask = make_batch(batch, length, gen)
        x, mask = x.to(args.device), mask.to(args.device)
        by_length[str(length)] = margins(logprobs(model, x, 2), x, mask)
        print(f"eval length {length}: {json.dumps(by_length[str(length)])}", flush=True)
    x, mask = make_batch(4, min(2048, args.long_len), gen)
    x, mask = x.to(args.device), mask.to(args.device)
    sens = sensitivity(model, x, mask, 2)
    for row in sens:
        print(f"sensitivity: {json.dumps(row)}", flush=True)
    return {"by_length": by_length, "sensitivity_x1.1": sens}


def save(model: torch.nn.Module, out: Path, cfg: dict[str, Any], record: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    write_static_files(out)  # the committed tokenizer and config (transformers' own writers differ by version)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    added = add_shared_kv_norms(out)  # vLLM <= 0.26 wants k_norm weights on KV-shared layers
    record["added_k_norms"] = added
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=TRAIN_LEN)
    p.add_argument("--long-every", type=int, default=4, help="every N-th step is one long batch (0: none)")
    p.add_argument("--long-batch", type=int, default=2)
    p.add_argument("--long-len", type=int, default=LONG_LEN)
    p.add_argument("--eval-lengths", type=int, nargs="*", default=[2048, 4096, LONG_LEN],
                   help="lengths (past the training length) whose margins are measured")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # On a busy CPU, torch's default threads fight the other processes (10x slower measured): one thread there.
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: 1 on CPU, torch's on GPU)")
    p.add_argument("--shrink", action="store_true",
                   help="a few-MB model of the same layout (tests of this script on CPU; never for parity)")
    p.add_argument("--out", type=Path, default=HERE)
    return p.parse_args(argv)


def shrunk(cfg: dict[str, Any]) -> dict[str, Any]:
    return {**cfg, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "head_dim": 32,
            "global_head_dim": 64, "hidden_size_per_layer_input": 16, "sliding_window": 32}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.shrink and args.out.resolve() == HERE:
        raise SystemExit("--shrink makes a test model: write it elsewhere (--out DIR), never over the checkpoint")
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    cfg = shrunk(config_dict()) if args.shrink else config_dict()
    assert cfg["max_position_embeddings"] == MAX_POSITIONS and cfg["num_kv_shared_layers"] == NUM_KV_SHARED
    model = build_model(cfg, args.seed, args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params / 1e6:.0f}M on {args.device}", flush=True)
    result = train(model, args)
    checks = evaluate(model, args)
    record = {
        "command": "python3 experiments/models/gemma4-e2b-shaped/train.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {k: str(v) for k, v in vars(args).items()},
        "torch": torch.__version__, "parameters": n_params, "shrunk": args.shrink,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        **result, **checks}
    save(model, args.out, cfg, record)
    print(f"wrote {args.out}", flush=True)
    return record


if __name__ == "__main__":
    main()
