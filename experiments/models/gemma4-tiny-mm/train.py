"""Train the embedded tiny multimodal Gemma 4 (vision tower + gemma4-tiny's text shape) from a fixed seed on CPU.

    .venv/bin/python experiments/models/gemma4-tiny-mm/train.py            # writes the checkpoint here

Each step trains on reading sequences (an 8 x 8 picture of coloured cells, then its cells' symbols in raster
order: see task.py) and on the text model's copying task, so the greedy tokens of an image prompt are read off
the picture and text prompts still work. Deterministic given (seed, steps, threads): one thread, fixed
generators, no workers. Needs torchvision (the Gemma 4 image processor imports it; setup.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from files import make_config, write_processor
from task import CELLS, PAD_ID, READ_HEADER, TASK, VOCAB_SIZE, draw, random_cells, read_sequence, symbol, text_prefix

HERE = Path(__file__).resolve().parent


def image_inputs(processor, cell_rows: list[list[int]]) -> dict[str, torch.Tensor]:
    pics = [draw(cells).permute(2, 0, 1) for cells in cell_rows]
    out = processor(pics, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_position_ids": out["image_position_ids"]}


def read_batch(processor, batch: int, answers: int, gen: torch.Generator, *, aux: bool = False,
               max_text: int = 0):
    """Reading sequences; all rows of a batch share one random text length in 0..max_text."""
    cells = [random_cells(gen) for _ in range(batch)]
    n = int(torch.randint(0, max_text + 1, (1,), generator=gen).item()) if max_text else 0
    ids = torch.tensor([read_sequence(c, answers, text_prefix(n, gen)) for c in cells])
    labels = torch.full_like(ids, -100)
    start = n + READ_HEADER   # the first answer
    labels[:, start:] = ids[:, start:]
    if aux:
        # Training aid: the output at image token k (position n + 3 + k) also names cell k. It teaches the vision
        # path to decode colours without first having to find which image token an answer reads, which the
        # answers alone learn only once both are partly in place. Prompts never ask for these positions.
        labels[:, n + 4:n + 4 + CELLS] = torch.tensor([[symbol(c) for c in row] for row in cells])
    return ids, labels, image_inputs(processor, cells)


def text_batch(batch: int, length: int, gen: torch.Generator):
    ids, determined = TASK.make_batch(batch, length, gen)
    labels = torch.where(determined, ids, torch.full_like(ids, -100))
    return ids, labels


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token cross entropy on labelled positions; also the argmax accuracy and top-1/top-2 gaps."""
    logits, labels = logits[:, :-1].float(), labels[:, 1:]
    mask = labels != -100
    sel, tgt = logits[mask], labels[mask]
    loss = torch.nn.functional.cross_entropy(sel, tgt)
    top2 = sel.topk(2, dim=-1)
    acc = (top2.indices[:, 0] == tgt).float().mean()
    return loss, acc, (top2.values[:, 0] - top2.values[:, 1]).detach()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def evaluate(model, processor, seed: int, batch: int = 16) -> dict[str, float]:
    gen = torch.Generator().manual_seed(seed)
    ids, labels, img = read_batch(processor, batch, CELLS + 8, gen, max_text=128)
    _, acc, gaps = lm_loss(model(input_ids=ids, **img).logits, labels)
    tids, tlabels = text_batch(batch, 224, gen)
    _, tacc, tgaps = lm_loss(model(input_ids=tids).logits, tlabels)
    return {"read_acc": acc.item(), "read_gap_min": gaps.min().item(),
            "read_gap_median": gaps.median().item(), "text_acc": tacc.item(), "text_gap_min": tgaps.min().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--read-batch", type=int, default=8)
    ap.add_argument("--text-batch", type=int, default=8)
    ap.add_argument("--answers", type=int, default=72, help="answer tokens per reading sequence (64 = one pass)")
    ap.add_argument("--max-text", type=int, default=128, help="longest text in front of <read> (random per step)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import Gemma4ForConditionalGeneration

    args.out.mkdir(parents=True, exist_ok=True)
    write_processor(args.out)
    from transformers import Gemma4ImageProcessor

    processor = Gemma4ImageProcessor.from_pretrained(str(args.out))
    torch.manual_seed(args.seed)
    model = Gemma4ForConditionalGeneration(make_config()).to(torch.float32)
    # As in gemma4-tiny: a unit-RMS Per-Layer-Embedding table keeps PLE in play (see its train.py).
    ple = model.model.language_model.embed_tokens_per_layer
    torch.nn.init.normal_(ple.weight, std=model.config.text_config.hidden_size_per_layer_input**-0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    history, t0 = [], time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        ids, labels, img = read_batch(processor, args.read_batch, args.answers, gen, aux=True,
                                       max_text=args.max_text)
        read_loss, read_acc, _ = lm_loss(model(input_ids=ids, **img).logits, labels)
        tids, tlabels = text_batch(args.text_batch, 224, gen)
        text_loss, text_acc, _ = lm_loss(model(input_ids=tids).logits, tlabels)
        loss = read_loss + text_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            row = {"step": step, "read_loss": read_loss.item(), "read_acc": read_acc.item(),
                   "text_loss": text_loss.item(), "text_acc": text_acc.item(),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            history.append(row)
            print(json.dumps(row), flush=True)
    model.eval()
    final = evaluate(model, processor, seed=10_000 + args.seed)
    print(json.dumps({"final_eval": final}), flush=True)
    model.save_pretrained(str(args.out))
    (args.out / "generation_config.json").unlink(missing_ok=True)  # greedy params come from the harness
    log = {"command": "python experiments/models/gemma4-tiny-mm/train.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
           "torch": torch.__version__, "wall_s": round(time.perf_counter() - t0, 1),
           "final_eval": final, "history": history}
    (args.out / "training.json").write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    assert VOCAB_SIZE > PAD_ID
    main()
