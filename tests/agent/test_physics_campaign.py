"""A campaign places every cell on the host's roofline: a candidate faster than physics allows is quarantined,
never accepted; the ceilings it was judged against are in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.base import GiveUp, Proposal
from agent.campaign import CampaignEnd
from audit.reader import payload_of, read_records
from audit.verify import verify
from harness.ceilings import Ceilings
from harness.config import BenchmarkConfig
from harness.physics import measured_seconds
from harness.roofline import Workload, cell_work, load_model_shape
from tests.conftest import TINY_MODEL
from tests.fake_campaign import gemma4_patch, start, write_target
from tests.fake_measurements import FakeMeasurements
from tests.fakes import FakeProposer


def _ceilings_for_stock_at(share: float) -> Ceilings:
    """Ceilings under which the fake's stock build (1,000 tok/s on every cell) needs `share` of the matmul rate at its
    most demanding cell; bandwidth and caches never bind."""
    bench = BenchmarkConfig(input_lens=[8], output_lens=[4], num_prompts=8, max_concurrency=4)
    shape = load_model_shape(TINY_MODEL)
    need = 0.0
    for cell in bench.cells():
        load = Workload(cell.input_len, cell.output_len, bench.prompts_for(cell), bench.max_concurrency)
        work = cell_work(shape, load, weight_itemsize=4, kv_itemsize=4)
        key = "prefill_tok_s" if cell.is_prefill else "total_token_throughput"
        seconds = measured_seconds(cell, bench.prompts_for(cell), {key: 1000.0})
        assert seconds is not None
        need = max(need, work.min_flops / seconds)
    rate = need / share
    return Ceilings(flop_s=rate, bytes_s=1e15, flop_s_best=rate, bytes_s_best=1e15, cache_bytes=1e12,
                    dtype="float32", source="test")


def _results(log_dir: Path) -> list[dict[str, object]]:
    return [payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == "iteration.result"]


@pytest.fixture(scope="module")
def quarantined(tmp_path_factory: pytest.TempPathFactory) -> tuple[CampaignEnd, FakeMeasurements]:
    """Stock at 60 % of the floor's matmul rate; a patch that makes every cell 2x faster would need 120 %."""
    tmp_path = tmp_path_factory.mktemp("physics")
    proposer = FakeProposer([Proposal("skip half the work", gemma4_patch("SPEED = 2.0"), predicted_speedup=2.0,
                                      source="fake:1")], when_done=GiveUp("nothing left"))
    measure = FakeMeasurements(ceilings=_ceilings_for_stock_at(0.6))
    end = start(write_target(tmp_path, iterations=1), tmp_path / "logs", tmp_path / "ws", measure, proposer=proposer)
    return end, measure


def test_a_candidate_faster_than_the_hosts_roofline_is_quarantined_and_never_accepted(
        quarantined: tuple[CampaignEnd, FakeMeasurements]) -> None:
    end, measure = quarantined
    results = _results(end.log_dir)
    assert [r["outcome"] for r in results] == ["quarantined"], results
    assert str(results[0]["reason"]).startswith("impossible: in8/out4 took")   # its most demanding cell
    assert not results[0].get("commit") and end.verdict.status == "no-change"
    rows = results[0]["cells_rows"]
    assert isinstance(rows, list) and any(row["roofline"]["impossible"] for row in rows)
    baseline = payload_of(end.log_dir, next(r for r in read_records(end.log_dir) if r["kind"] == "baseline.result"))
    assert baseline["ceilings"]["source"] == "test" and measure.calls.count("ceilings") == 1
    assert all(not row["roofline"]["impossible"] and 0.1 < row["roofline"]["roofline"] <= 0.6
               for row in baseline["cells"])
    assert verify(end.log_dir).ok


def test_the_report_and_the_mlflow_run_place_every_cell_on_the_roofline(
        quarantined: tuple[CampaignEnd, FakeMeasurements], tmp_path: Path) -> None:
    import mlflow

    from agent.cli import main

    end, _ = quarantined
    summary = (end.log_dir / "summary.md").read_text()
    assert "## Roofline" in summary and "Ceilings: " in summary and "| in8/out4 |" in summary.split("## Roofline")[1]
    html = (end.log_dir / "report.html").read_text()
    assert "The candidate on the roofline" in html and "IMPOSSIBLE" in html
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["export", "mlflow", str(end.log_dir), "--tracking-uri", uri, "--no-anchor"]) == 0
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    assert 0.1 < run.data.metrics["stock/in8/out4/roofline"] <= 0.6 and run.data.metrics["stock/in8/out4/mfu"] > 0
    assert [m.value for m in client.get_metric_history(run.info.run_id, "cell/in8/out4/impossible")] == [1.0]
    assert run.data.params["ceilings"].endswith("test")


def test_a_host_without_ceilings_runs_its_campaign_and_says_why_there_is_no_physical_check(tmp_path: Path) -> None:
    proposer = FakeProposer([Proposal("a faster kernel", gemma4_patch("SPEED = 1.6"), predicted_speedup=1.5,
                                      source="fake:1")], when_done=GiveUp("nothing left"))
    end = start(write_target(tmp_path, iterations=1), tmp_path / "logs", tmp_path / "ws",
                FakeMeasurements(ceilings=None), proposer=proposer)
    assert [r["outcome"] for r in _results(end.log_dir)] == ["accepted"]
    baseline = payload_of(end.log_dir, next(r for r in read_records(end.log_dir) if r["kind"] == "baseline.result"))
    assert "no ceilings" in baseline["ceilings"]["omitted"]
    assert all("floor_s" not in row["roofline"] and row["roofline"]["flops"] > 0 for row in baseline["cells"])
