"""benchmark.cell_prompts: named cells send their own number of requests per run, at the same concurrency; a label
outside the grid is refused, naming the grid."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.bench import BenchJob, job_argv
from harness.config import BenchmarkConfig


def _config(**kw: object) -> BenchmarkConfig:
    return BenchmarkConfig(input_lens=[512, 8192], output_lens=[256], num_prompts=128, max_concurrency=128,
                           prefill_prompts_factor=2, **kw)


def _sent(config: BenchmarkConfig, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Per cell, the --num-prompts and --max-concurrency the client is run with."""
    out = {}
    for cell in config.cells():
        argv = job_argv(BenchJob(cell=cell, base_url="http://127.0.0.1:1", model_name="m", tokenizer=tmp_path,
                                 tag="A", repeat=0), config, tmp_path, "r.json")
        out[cell.label] = (argv[argv.index("--num-prompts") + 1], argv[argv.index("--max-concurrency") + 1])
    return out


def test_a_named_cell_sends_its_own_count_and_the_others_are_unchanged(tmp_path: Path) -> None:
    sent = _sent(_config(cell_prompts={"in512/out256": 512, "in8192/out1": 64}), tmp_path)
    assert sent == {"in512/out256": ("512", "128"), "in8192/out256": ("128", "128"),
                    "in512/out1": ("256", "128"), "in8192/out1": ("64", "128")}
    assert _sent(_config(), tmp_path)["in512/out256"] == ("128", "128")


def test_a_cell_outside_the_grid_is_refused_naming_the_grid() -> None:
    with pytest.raises(ValidationError, match=r"cell_prompts names cells in2048/out256, which are not in the grid "
                                              r"\(in512/out256, in8192/out256, in512/out1, in8192/out1\)"):
        _config(cell_prompts={"in2048/out256": 512})
    with pytest.raises(ValidationError):
        _config(cell_prompts={"in512/out256": 0})
