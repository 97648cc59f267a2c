"""Several candidates against one incumbent on real vLLM (CPU): every server started together, a candidate
that breaks parity dropped before the benchmark, one whose config cannot start left out without costing the
others their measurement, and the rest interleaved with the incumbent."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import BenchmarkConfig, ParityConfig, ServerConfig, StatsConfig
from harness.errors import ServerCrashed
from harness.measure import Build, compare_arms
from sandbox.local import LocalBackend
from sandbox.workspace import Workspace
from tests.conftest import ROOT, TINY_MODEL, processes_under

pytestmark = [pytest.mark.vllm]
ENGINE = {"enforce_eager": True, "dtype": "float32", "max_model_len": 2048}


def _held(tmp_path: Path) -> Path:
    lines = (ROOT / "experiments" / "prompts" / "gemma4-tiny-parity-grid.jsonl").read_text().splitlines()[:8]
    path = tmp_path / "held.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(900)
def test_candidates_screened_together_each_get_their_own_verdict(vllm_workspace: Path, tmp_path: Path) -> None:
    ws = Workspace.open(vllm_workspace)

    def build(tag: str, patch: str | None = None, **engine: object) -> Build:
        tree = ws.checkout_copy("HEAD", tmp_path / f"tree-{tag}")
        if patch is not None:
            Workspace.open(tree, "vllm").apply_patch(patch)
        return Build(tag=tag, tree=tree, engine_args={**ENGINE, **engine})

    a = build("A")
    same = build("B1")
    broken = build("B2", (TINY_MODEL / "planted" / "norm-skipped.patch").read_text())
    unstartable = build("B3", max_model_len=1_000_000)      # beyond the model's positions: vLLM refuses
    bench = BenchmarkConfig(input_lens=[64], output_lens=[8], prefill=False, num_prompts=8, max_concurrency=4,
                            num_warmups=1, repeats=2, dataset="copy-task")
    messages: list[str] = []
    results = compare_arms(
        LocalBackend(), a, [same, broken, unstartable],
        server=ServerConfig(model=TINY_MODEL, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout_s=400),
        bench=bench, stats_cfg=StatsConfig(), parity=ParityConfig(prompts=_held(tmp_path), max_tokens=8),
        work_dir=tmp_path / "run", cache_dir=tmp_path / "cache", stop_on_parity_failure=True,
        progress=messages.append)
    ok, bad, dead = results
    assert "starting A, B1, B2, B3 together" in messages, messages
    # the identical build: parity holds, measured against A at every repeat, its runs paired with A's
    assert ok.error is None and ok.parity is not None and ok.parity.ok, ok.parity and ok.parity.summary()
    assert ok.overall is not None and len(ok.b.runs) == 2 and len(ok.a.runs) == 2
    assert {run.job.tag for run in ok.b.runs} == {"B1"} and ok.b.evidence.get("vllm_file")
    # the planted bug: caught on the held prompts, and never benchmarked (its server idled frozen)
    assert bad.parity is not None and not bad.parity.ok and bad.overall is None and not bad.b.runs
    # the config vLLM refuses: its own error, with the log's reason; A and B1 were measured regardless
    assert isinstance(dead.error, ServerCrashed) and "max_model_len" in str(dead.error)
    assert dead.overall is None and not dead.b.runs
    assert not processes_under(tmp_path / "run")
