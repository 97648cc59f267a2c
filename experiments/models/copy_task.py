"""Mode-selected copying, the task both parity checkpoints are trained on (gemma4-tiny, gemma4-e2b-shaped): one
implementation, sized by each checkpoint's own periods and token ranges (their task.py says why those).

`<bos> <mode> payload...`: in <short> mode the payload repeats with `short_period`; in <mixed> mode even payload
positions repeat with `short_period` (tokens first_payload_id..split_id-1) and odd ones with `long_period` (tokens
split_id..vocab_size-1). Positions after the first period(s) are determined exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CopyTask"]


@dataclass(frozen=True)
class CopyTask:
    vocab_size: int
    first_payload_id: int
    split_id: int
    short_period: int
    long_period: int
    bos_id: int
    short_id: int
    mixed_id: int
    header: int = 2  # <bos> <mode>

    def make_sequence(self, mode: str, length: int, gen: torch.Generator) -> list[int]:
        """One task sequence of ``length`` tokens (header included) in the given mode."""
        idx = torch.arange(length - self.header)
        if mode == "short":
            first = torch.randint(self.first_payload_id, self.vocab_size, (self.short_period,), generator=gen)
            payload = first[idx % self.short_period]
        else:
            even = torch.randint(self.first_payload_id, self.split_id, (self.short_period // 2,), generator=gen)
            odd = torch.randint(self.split_id, self.vocab_size, (self.long_period // 2,), generator=gen)
            half = idx // 2
            payload = torch.where(idx % 2 == 0, even[half % (self.short_period // 2)],
                                  odd[half % (self.long_period // 2)])
        return [self.bos_id, self.short_id if mode == "short" else self.mixed_id, *payload.tolist()]

    def determined(self, mode: str, length: int) -> torch.Tensor:
        """Mask over a sequence's indices: True where the token is a copy (determined by earlier ones)."""
        i = torch.arange(length) - self.header
        if mode == "short":
            return i >= self.short_period
        return ((i % 2 == 0) & (i >= self.short_period)) | ((i % 2 == 1) & (i >= self.long_period))

    def make_batch(self, batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Even rows <short>, odd rows <mixed>, plus the mask of determined (copy) targets."""
        modes = ["short" if i % 2 == 0 else "mixed" for i in range(batch)]
        rows = [self.make_sequence(m, length, gen) for m in modes]
        return torch.tensor(rows), torch.stack([self.determined(m, length) for m in modes])
