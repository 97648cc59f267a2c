"""Every file a campaign's verdicts rest on is bound to its log (agent/evidence.py): the parity reference, each step's
raw benchmark results, prompt files, client log, timings and server logs, for the baseline, every screen, every
confirmation and the final comparison; `ratchet audit verify` names the first one that differs, the report names
them all, and a campaign killed and resumed still verifies with its evidence. Through the fake seam, without vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.cli import main
from audit import verify, write_report
from audit.evidence import bound_paths
from audit.reader import payload_of, read_records
from tests.fake_campaign import killed_at, resume, start, write_target


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One whole fake campaign (two accepted changes, a final comparison), copied by each test that edits it."""
    root = tmp_path_factory.mktemp("campaign")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RATCHET_AUDIT_KEY", str(root / "home" / "audit-key.ed25519"))
        end = start(write_target(root), root / "logs", root / "ws")
    assert end.verdict.status == "improved"
    return end.log_dir


@pytest.fixture
def campaign(finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "home" / "audit-key.ed25519"))   # no anchor of ours
    return Path(shutil.copytree(finished, tmp_path / finished.name, symlinks=True))


def _steps(log_dir: Path) -> list[str]:
    return [payload_of(log_dir, r)["step"] for r in read_records(log_dir) if r["kind"] == "evidence"]


def _measured_files(log_dir: Path) -> set[str]:
    runs = log_dir / "runs"
    found = {*runs.rglob("server-*.log"), *(p for bench in runs.rglob("bench*") if bench.is_dir()
                                             for p in bench.rglob("*") if p.is_file())}
    return {p.relative_to(log_dir).as_posix() for p in found}


def test_every_measured_step_binds_its_raw_runs_prompts_logs_and_the_reference(campaign: Path) -> None:
    assert _steps(campaign) == ["baseline", "screen", "confirm", "screen", "confirm", "screen", "final"]
    bound = set(bound_paths(campaign))
    assert "parity-reference.json" in bound
    assert _measured_files(campaign) <= bound   # every raw result, prompt file, client log, timings, server log
    kinds = {Path(p).name.split("0")[0].split("-")[0] for p in bound}
    assert {"job", "prompts", "client.log", "timings.jsonl", "server"} <= kinds
    result = verify(campaign)
    assert result.ok and result.evidence_files == len(bound) and result.evidence_records == 7
    # each manifest comes before the record that uses it
    kinds_in_order = [r["kind"] for r in read_records(campaign)]
    assert kinds_in_order.index("evidence") < kinds_in_order.index("baseline.result")
    assert kinds_in_order[::-1].index("evidence") > kinds_in_order[::-1].index("campaign.end")


def test_ratchet_audit_verify_names_an_edited_raw_run_and_an_edited_reference(
        campaign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", str(campaign)]) == 0
    assert capsys.readouterr().out.startswith(f"verified {len(read_records(campaign))} records, ")

    job = campaign / "runs" / "final" / "bench" / "job0000.json"
    original = job.read_bytes()
    data = json.loads(original)
    data["total_token_throughput"] *= 3
    job.write_text(json.dumps(data))
    assert main(["audit", "verify", str(campaign)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAILED at seq ") and "evidence file runs/final/bench/job0000.json was changed" in out
    assert "(step final)" in out

    job.write_bytes(original)
    reference = campaign / "parity-reference.json"
    reference.write_text(reference.read_text().replace("-0.01", "-0.02", 1))
    assert main(["audit", "verify", str(campaign)]) == 1
    assert "evidence file parity-reference.json was changed" in capsys.readouterr().out


def test_a_deleted_raw_run_and_a_symlink_swapped_in_are_named(campaign: Path) -> None:
    screen = campaign / "runs" / "it001" / "bench" / "job0003.json"
    screen.unlink()
    prompts = sorted((campaign / "runs" / "it002" / "confirm" / "bench").glob("prompts-*.jsonl"))[0]
    copy = campaign.parent / "prompts-copy.jsonl"
    shutil.copy(prompts, copy)
    prompts.unlink()
    prompts.symlink_to(copy)   # the same bytes, through a link that could point anywhere
    result = verify(campaign)
    assert not result.ok and result.reason.startswith("evidence file runs/it001/bench/job0003.json is missing")
    assert any(p.startswith(f"evidence file {prompts.relative_to(campaign).as_posix()} cannot be checked")
               and "is a symlink" in p for p in result.evidence_problems)


def test_the_report_names_missing_evidence_beside_the_verdict(campaign: Path, tmp_path: Path) -> None:
    (campaign / "runs" / "final" / "server-B.log").unlink()
    html_path, md_path = write_report(campaign, out_dir=tmp_path / "report")
    summary = md_path.read_text()
    assert "- EVIDENCE MISSING OR CHANGED (1 file(s)): evidence file runs/final/server-B.log is missing" in summary
    assert summary.index("EVIDENCE MISSING") < summary.index("## Final comparison")
    html = html_path.read_text()
    assert html.index("EVIDENCE MISSING") < html.index("Final comparison: best vs stock")
    assert "<p class='bad'>EVIDENCE MISSING OR CHANGED" in html


def test_the_report_of_an_intact_campaign_says_its_evidence_was_verified(campaign: Path, tmp_path: Path) -> None:
    _, md_path = write_report(campaign, out_dir=tmp_path / "report")
    line = next(x for x in md_path.read_text().splitlines() if "evidence" in x.lower())
    assert line == (f"- evidence verified: {len(bound_paths(campaign)):,} files beside the log (raw benchmark "
                    "results, prompts, server logs, parity reference) are as the log bound them")


def _record_after(log_dir: Path, step: str) -> int:
    """The seq of the record right after `step`'s evidence record in an unkilled campaign's log."""
    records = read_records(log_dir)
    at = next(r["seq"] for r in records if r["kind"] == "evidence" and payload_of(log_dir, r)["step"] == step)
    return int(at) + 1


@pytest.mark.timeout(300)
def test_a_campaign_killed_around_its_evidence_resumes_and_verifies_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the baseline's manifest but before baseline.result (the baseline runs again, into new files),
    mid-final (half-written files are bound to nothing), and after the final's manifest but before campaign.end
    (the final runs again, into a new folder): each resumes to an end whose log verifies with all its evidence."""
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "home" / "audit-key.ed25519"))
    counts_file = tmp_path / "counts.json"
    dry = write_target(tmp_path / "dry")
    assert killed_at(None, ["start", str(dry), str(tmp_path / "dry" / "logs"), str(tmp_path / "dry" / "ws")],
                     counts_file=counts_file) == 0
    (dry_log,) = (tmp_path / "dry" / "logs").iterdir()
    servers = json.loads(counts_file.read_text())["servers"]
    # AuditWriter.append's n-th call writes seq n - 1 in a campaign that runs through: kill before seq S at S + 1
    points = {"before baseline.result": f"append:{_record_after(dry_log, 'baseline') + 1}",
              "mid-final": f"servers:{servers}",
              "before campaign.end": f"append:{_record_after(dry_log, 'final') + 1}"}
    for where, point in points.items():
        case = tmp_path / where.replace(" ", "-").replace(".", "-")
        spec = write_target(case)
        assert killed_at(point, ["start", str(spec), str(case / "logs"), str(case / "ws")]) == -9, where
        (log_dir,) = (case / "logs").iterdir()
        before = [r["kind"] for r in read_records(log_dir)]
        assert before[-1] == "evidence" or where == "mid-final", (where, before[-3:])
        if where == "mid-final":   # a step killed mid-way leaves files no manifest binds
            (log_dir / "runs" / "final" / "bench").mkdir(parents=True, exist_ok=True)
            (log_dir / "runs" / "final" / "bench" / "job0000.json").write_text('{"total_token_thr')
        end = resume(log_dir)
        assert end.verdict.status == "improved", where
        result = verify(log_dir)
        assert result.ok, (where, result.reason)
        assert result.evidence_records == len(_steps(log_dir)) >= 7, where
        assert _measured_files(log_dir) - set(bound_paths(log_dir)) <= (
            {"runs/final/bench/job0000.json", "runs/final/server-A.log", "runs/final/server-B.log"}
            if where == "mid-final" else set()), where
        if where == "before baseline.result":   # run again beside the first run's files, both bound
            assert {"parity-reference.json", "parity-reference-2.json"} <= set(bound_paths(log_dir))
            baseline = next(payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == "baseline.result")
            assert baseline["reference_file"] == "parity-reference-2.json"
        if where != "before baseline.result":
            assert (log_dir / "runs" / "final-2").is_dir(), where


def test_an_exported_campaign_verifies_with_its_evidence_from_mlflow_alone(campaign: Path, tmp_path: Path) -> None:
    import mlflow  # the mlflow extra: ./setup.sh test installs it

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["export", "mlflow", str(campaign), "--tracking-uri", uri, "--no-anchor"]) == 0
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    back = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="audit",
                                                   dst_path=str(tmp_path / "back"), tracking_uri=uri))
    result = verify(back)
    assert result.ok, result.reason
    assert result.evidence_files == len(bound_paths(campaign)) and result.evidence_records == 7
