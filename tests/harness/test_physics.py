"""Floors, attainment and claims: the seed claim's verdict, the committed H200 grid, the quarantine figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.spec import load_spec
from harness.ceilings import Ceilings, cpu_cache_bytes, named_ceilings, server_threads
from harness.errors import CeilingsUnavailable
from harness.physics import (
    judge_claim,
    measured_seconds,
    physics_of,
    roofline_rows,
    served_model,
    workload_of,
)
from harness.roofline import Workload, load_model_shape
from tests.conftest import ROOT

E2B = ROOT / "experiments" / "models" / "gemma4-e2b-dummy"
# the H200's ceilings as the kernel harness measured them (experiments/results/kernel-campaign-h200.json)
H200 = Ceilings(flop_s=787.4e12, bytes_s=4275e9, flop_s_best=808.6e12, bytes_s_best=4300e9, cache_bytes=50 * 2**20,
                dtype="bfloat16", source="kernel harness, H200")


def test_the_seed_claim_needs_more_than_an_a100s_peak_as_vllm_serves_by_default() -> None:
    """37.9k -> 108k tok/s on one A100: the baseline fits; 108k needs > 100 % of the 312 TFLOP/s peak with every
    layer run on every prompt token, and is possible in principle only with the KV-shared layers skipped."""
    shape = load_model_shape(E2B)
    a100 = named_ceilings("A100-80GB-SXM")
    for input_len, output_len in ((512, 128), (2048, 256), (8192, 1)):
        load = Workload(input_len, output_len, num_prompts=256, concurrency=256)
        before, after = judge_claim(shape, load, a100, 37_900), judge_claim(shape, load, a100, 108_000)
        assert before.verdict == "possible" and before.need_served < 0.6
        assert after.need_served > 1.0 and after.need_min < 1.0
        assert after.verdict == "needs" and "impossible" in after.text and "kv_sharing_fast_prefill" in after.text


def test_a_claim_beyond_even_the_least_work_is_impossible() -> None:
    verdict = judge_claim(load_model_shape(E2B), Workload(512, 128, 256, 256), named_ceilings("L4"), 108_000)
    assert verdict.verdict == "impossible" and verdict.need_min > 1
    assert verdict.text.startswith("impossible unless tokens are skipped")


def test_the_committed_h200_stock_grid_is_below_its_roofline_everywhere() -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    grid = json.loads((ROOT / "experiments" / "results" / "h200-e2b-stock-grid.json").read_text())
    bench = spec.benchmark.model_copy(update={"prefill_prompts_factor": 1})   # measured before the factor existed
    rows = roofline_rows(grid["cells"], served_model(spec.server.model, grid["engine_args"]), H200, bench)
    for row in rows:
        rf = row["roofline"]
        assert not rf["impossible"] and 0.05 < rf["roofline"] < 1 and 0.2 < rf["mfu"] < 0.6, (row["cell"], rf)
        assert rf["bound"] == "compute"                     # 256 requests at once: every cell is compute-bound


def test_a_cell_twice_as_fast_as_the_h200s_floor_allows_is_physically_impossible() -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    served = served_model(spec.server.model, spec.server.engine_args)
    cell = next(c for c in spec.benchmark.cells() if c.label == "in2048/out1")
    work_s = measured_seconds(cell, spec.benchmark.prompts_for(cell), {"prefill_tok_s": 101_593.0})
    assert work_s is not None
    honest, claimed = 101_593.0, 101_593.0 * 8       # 8x stock prefill: far past the floor
    figures = physics_of(served, H200, spec.benchmark, {cell: {"prefill_tok_s": [honest, claimed]}})
    assert figures["in2048/out1"].impossible                # the fastest run decides
    assert not physics_of(served, H200, spec.benchmark, {cell: {"prefill_tok_s": [honest]}})["in2048/out1"].impossible


def test_no_ceilings_or_no_model_means_no_physical_figures(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    cell = spec.benchmark.cells()[0]
    served = served_model(spec.server.model, spec.server.engine_args)
    assert physics_of(served, None, spec.benchmark, {cell: {"total_token_throughput": [1.0]}}) == {}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    assert physics_of(served_model(tmp_path, {}), H200, spec.benchmark, {cell: {"total_token_throughput": [1e9]}}) == {}


def test_workloads_take_the_specs_prompts_and_concurrency() -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    prefill = next(c for c in spec.benchmark.cells() if c.is_prefill)
    assert workload_of(prefill, spec.benchmark) == Workload(prefill.input_len, 1, 1024, 256)


def test_datasheets_are_named_and_an_unknown_gpu_or_dtype_refused() -> None:
    assert named_ceilings("a100").flop_s == 312e12 and named_ceilings("H200").bytes_s == 4800e9
    with pytest.raises(CeilingsUnavailable, match="known: A100-40GB-SXM"):
        named_ceilings("RTX-9090")
    with pytest.raises(CeilingsUnavailable, match="float32"):
        named_ceilings("H100", dtype="float32")


def test_server_threads_follow_the_servers_env() -> None:
    assert server_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert server_threads({"VLLM_CPU_OMP_THREADS_BIND": "0-3,6"}) == 5
    assert server_threads({"VLLM_CPU_OMP_THREADS_BIND": "auto"}) is None and server_threads({}) is None


def test_cpu_caches_are_summed_once_per_shared_cache(tmp_path: Path) -> None:
    import os

    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus:
        caches = {"index0": ("1", "Data", "48K", str(cpu)), "index1": ("1", "Instruction", "32K", str(cpu)),
                  "index2": ("3", "Unified", "32M", f"{cpus[0]}-{cpus[-1]}")}
        for name, (level, kind, size, shared) in caches.items():
            folder = tmp_path / f"cpu{cpu}" / "cache" / name
            folder.mkdir(parents=True)
            for field, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (folder / field).write_text(value + "\n")
    assert cpu_cache_bytes(tmp_path) == len(cpus) * 48 * 1024 + 32 * 2**20


def test_this_cpus_ceilings_are_measured_in_a_child_at_the_served_dtype_and_threads() -> None:
    from harness.ceilings import served_ceilings
    from harness.config import ServerConfig

    server = ServerConfig(model=ROOT / "experiments" / "models" / "gemma4-tiny", engine_args={"dtype": "auto"},
                          env={"OMP_NUM_THREADS": "1"})
    ceilings = served_ceilings(server, hardware="cpu")
    assert 0 < ceilings.flop_s <= ceilings.flop_s_best and 0 < ceilings.bytes_s <= ceilings.bytes_s_best
    assert ceilings.dtype == "float32" and "x 1 threads" in ceilings.source and "median" in ceilings.spread
    assert ceilings.cache_bytes > 0 and Ceilings.from_json(json.loads(json.dumps(ceilings.to_json()))) == ceilings
