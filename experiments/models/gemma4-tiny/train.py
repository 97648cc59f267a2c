"""Train the embedded tiny Gemma 4 checkpoint from a fixed seed, on this CPU, in minutes.

    .venv/bin/python experiments/models/gemma4-tiny/train.py            # writes the checkpoint here

Deterministic given (seed, steps, threads): one thread, fixed generator, no data loader workers.
The task (mode-selected copying, see task.py) needs attention inside the sliding window (short
mode, even stream of mixed mode) and across it (odd stream of mixed mode), so greedy tokens are both
confident and sensitive to real bugs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from task import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SLIDING_WINDOW,
    VOCAB_SIZE,
    config_kwargs,
    make_batch,
    token_strings,
)

HERE = Path(__file__).resolve().parent


def build_model(seed: int) -> torch.nn.Module:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = Gemma4TextConfig(**config_kwargs(), dtype="float32")
    config.architectures = ["Gemma4ForCausalLM"]
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(config).to(torch.float32)
    # PLE token table: the default init (std 0.02, x sqrt(16) = 0.08 RMS) is tiny next to the
    # RMS-normed context projection (~1) it is averaged with, and a model trained from it ignores
    # the table (a changed PLE scale then flips nothing). Unit RMS after scaling keeps both halves
    # in play, as in real Gemma 4 checkpoints, so PLE bugs show.
    ple = model.model.embed_tokens_per_layer
    torch.nn.init.normal_(ple.weight, std=config.hidden_size_per_layer_input**-0.5)
    return model


def write_tokenizer(out: Path) -> None:
    """WordLevel over the fixed token strings: decode -> encode round-trips exactly, which
    `vllm bench serve --dataset-name random` relies on (it decodes random ids and re-encodes them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(token_strings())}
    # Unknown words map to <pad>: every string this tokenizer ever decodes is in the vocabulary.
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    # Like Gemma: text prompts get <bos> prepended (the task's sequences all start with it).
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
        model_max_length=config_kwargs()["max_position_embeddings"],
    )
    fast.save_pretrained(str(out))


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to 5 % of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def measure(model: torch.nn.Module, gen: torch.Generator, *, batch: int, seq_len: int) -> dict[str, float]:
    """Accuracy and top-1/top-2 margin (nats) on the copy positions of a fresh batch, per mode."""
    model.eval()
    x, mask = make_batch(batch, seq_len, gen)
    logp = torch.log_softmax(model(input_ids=x).logits[:, :-1].float(), -1)
    tgt, m = x[:, 1:], mask[:, 1:]
    top2 = logp.topk(2, -1)
    correct = (top2.indices[..., 0] == tgt) & m
    gap = (top2.values[..., 0] - top2.values[..., 1])[m]
    out = {"acc": correct.sum().item() / m.sum().item(), "gap_min": gap.min().item(),
           "gap_p1": gap.quantile(0.01).item(), "gap_median": gap.median().item(),
           "frac_gap_ge_1": (gap >= 1.0).float().mean().item()}
    for name, rows in (("short", slice(0, None, 2)), ("mixed", slice(1, None, 2))):
        out[f"acc_{name}"] = correct[rows].sum().item() / m[rows].sum().item()
    model.train()
    return out


def train(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    model = build_model(args.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 1)
    t0 = time.perf_counter()
    history: list[dict[str, float]] = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, mask = make_batch(args.batch, args.seq_len, gen)
        logits = model(input_ids=x).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]].float(), x[:, 1:][mask[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            with torch.no_grad():
                pred = logits.argmax(-1)
                m = mask[:, 1:]
                acc = ((pred == x[:, 1:]) & m).sum().item() / m.sum().item()
                acc_s = ((pred == x[:, 1:]) & m)[0::2].sum().item() / m[0::2].sum().item()
                acc_m = ((pred == x[:, 1:]) & m)[1::2].sum().item() / m[1::2].sum().item()
            rec = {"step": step, "loss": loss.item(), "acc": acc, "acc_short": acc_s, "acc_mixed": acc_m,
                   "lr": opt.param_groups[0]["lr"], "wall_s": time.perf_counter() - t0}
            history.append(rec)
            print(f"step {step:5d}  loss {rec['loss']:.4f}  acc {acc:.3f}  short {acc_s:.3f}  "
                  f"mixed {acc_m:.3f}  lr {rec['lr']:.2e}  {rec['wall_s']:.0f}s", flush=True)
    wall = time.perf_counter() - t0
    final = measure(model, torch.Generator().manual_seed(12345), batch=32, seq_len=args.seq_len)
    print("final (fresh batch):", json.dumps(final), flush=True)
    return {"model": model, "wall_s": wall, "history": history, "final": final, "final_loss": loss.item()}


def save(out: Path, result: dict[str, object], args: argparse.Namespace) -> None:
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model = result["model"]
    assert isinstance(model, torch.nn.Module)
    model.save_pretrained(str(out), safe_serialization=True)
    # transformers >= 5.19 writes the full layers' head dim only inside per_layer_config; older ones (5.5, the
    # one vLLM 0.26 needs on the H200) read global_head_dim and would build 32-dim full layers without it.
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("global_head_dim", config_kwargs()["global_head_dim"])
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(str(out))
    write_tokenizer(out)
    summary = {
        "command": "python experiments/models/gemma4-tiny/train.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "torch": torch.__version__,
        "wall_s": round(float(result["wall_s"]), 1),  # type: ignore[arg-type]
        "final_train_loss": result["final_loss"],
        "final_eval": result["final"],
        "history": result["history"],
    }
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=224, help="covers prompt (<=160) + 64 generated tokens")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=60)
    # On 2 busy cores, 1 thread measured ~10x faster than 2 (no contention with other jobs).
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--out", type=Path, default=HERE)
    return p.parse_args(argv)


if __name__ == "__main__":
    assert SLIDING_WINDOW < 40 and VOCAB_SIZE == 256  # the task's periods assume these
    a = parse_args()
    r = train(a)
    save(a.out, r, a)
    print(f"wrote {a.out} in {r['wall_s']:.0f}s", flush=True)
