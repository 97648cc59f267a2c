"""Evidence manifests (audit/evidence.py): files beside the log bound by sha256 and size in `evidence` records, and
verify naming the first one that was changed, removed or swapped for a symlink, with the seq that bound it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from audit import AuditWriter, EvidenceError, append_evidence, verify
from audit.evidence import bound_paths, manifest
from audit.verify import NO_EVIDENCE_NOTE


def _files(root: Path) -> list[str]:
    (root / "runs" / "final" / "bench").mkdir(parents=True)
    (root / "runs" / "final" / "bench" / "job0000.json").write_text(json.dumps({"total_token_throughput": 1000.0}))
    (root / "runs" / "final" / "server-A.log").write_text("INFO started\n")
    (root / "parity-reference.json").write_text('{"generations": []}\n')
    return ["parity-reference.json", "runs/final/bench/job0000.json", "runs/final/server-A.log"]


def _log(setup: Any, *, with_evidence: bool = True) -> int:
    """A log with one manifest (when asked) between two records; returns the manifest's seq."""
    setup.dir.mkdir(parents=True)
    paths = _files(setup.dir)
    with AuditWriter.open(setup.dir, campaign=setup.campaign, key_path=setup.key, anchor_dir=setup.anchors) as log:
        log.append("campaign.start", payload={"spec": "x"})
        bound = append_evidence(log, paths, step="final", iteration=4) if with_evidence else None
        log.append("campaign.end", payload={"verdict": {"status": "improved"}})
    return bound.seq if bound else -1


def test_a_log_with_evidence_verifies_and_counts_the_files(setup: Any) -> None:
    _log(setup)
    result = verify(setup.dir, anchor=setup.anchor)
    assert result.ok, result.reason
    assert (result.evidence_files, result.evidence_records) == (3, 1)
    assert result.summary() == f"verified {result.records} records, 3 evidence files"
    assert NO_EVIDENCE_NOTE not in result.notes
    assert bound_paths(setup.dir) == ["parity-reference.json", "runs/final/bench/job0000.json",
                                      "runs/final/server-A.log"]


def test_a_raw_run_with_its_throughput_tripled_is_named_with_the_seq_that_bound_it(setup: Any) -> None:
    seq = _log(setup)
    job = setup.dir / "runs" / "final" / "bench" / "job0000.json"
    data = json.loads(job.read_text())
    data["total_token_throughput"] *= 3
    job.write_text(json.dumps(data))
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and result.bad_seq == seq
    assert result.reason.startswith("evidence file runs/final/bench/job0000.json was changed")
    assert f"bound by record {seq} (step final)" in result.reason
    assert result.summary().startswith(f"FAILED at seq {seq}: evidence file runs/final/bench/job0000.json")


def test_an_edited_parity_reference_of_the_same_size_is_named(setup: Any) -> None:
    seq = _log(setup)
    reference = setup.dir / "parity-reference.json"
    reference.write_text(reference.read_text().replace("[]", "{}"))   # same size, other bytes
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and result.bad_seq == seq
    assert result.reason.startswith("evidence file parity-reference.json was changed")


def test_a_deleted_evidence_file_is_named_missing(setup: Any) -> None:
    seq = _log(setup)
    (setup.dir / "runs" / "final" / "server-A.log").unlink()
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and result.bad_seq == seq
    assert result.reason.startswith("evidence file runs/final/server-A.log is missing")


def test_a_symlink_swapped_in_for_an_evidence_file_is_named_even_to_identical_bytes(setup: Any) -> None:
    _log(setup)
    job = setup.dir / "runs" / "final" / "bench" / "job0000.json"
    elsewhere = setup.dir.parent / "job0000.json"
    elsewhere.write_bytes(job.read_bytes())
    job.unlink()
    job.symlink_to(elsewhere)
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok
    assert "evidence file runs/final/bench/job0000.json cannot be checked" in result.reason
    assert "is a symlink" in result.reason


def test_a_symlinked_folder_on_the_way_to_an_evidence_file_is_named(setup: Any) -> None:
    _log(setup)
    bench = setup.dir / "runs" / "final" / "bench"
    moved = setup.dir.parent / "bench-elsewhere"
    bench.rename(moved)
    bench.symlink_to(moved, target_is_directory=True)
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and "runs/final/bench is a symlink" in result.reason


def test_every_file_that_differs_is_listed_and_the_first_is_the_reason(setup: Any) -> None:
    _log(setup)
    (setup.dir / "parity-reference.json").write_text("{}\n")
    (setup.dir / "runs" / "final" / "server-A.log").unlink()
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and len(result.evidence_problems) == 2
    assert result.evidence_problems[0].startswith("evidence file parity-reference.json was changed")
    assert result.evidence_problems[1].startswith("evidence file runs/final/server-A.log is missing")
    assert result.reason == result.evidence_problems[0]


def test_an_old_log_without_manifests_verifies_and_says_no_evidence_is_bound(setup: Any) -> None:
    _log(setup, with_evidence=False)
    (setup.dir / "parity-reference.json").write_text("edited\n")   # bound to nothing: nothing to check
    result = verify(setup.dir, anchor=setup.anchor)
    assert result.ok and result.summary() == f"verified {result.records} records"
    assert result.evidence_records == 0 and NO_EVIDENCE_NOTE in result.notes


def test_a_changed_manifest_is_reported_as_its_changed_record_not_as_evidence(setup: Any) -> None:
    seq = _log(setup)
    lines = (setup.dir / "log.jsonl").read_bytes().splitlines(keepends=True)
    (setup.dir / "runs" / "final" / "server-A.log").write_text("INFO started, then edited\n")
    lines[seq] = lines[seq].replace(b'"size":13', b'"size":26')   # the attacker updates the manifest too
    (setup.dir / "log.jsonl").write_bytes(b"".join(lines))
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and result.bad_seq == seq and result.reason.startswith(f"record {seq} was changed")


@pytest.mark.parametrize("bad", ["../outside.json", "/etc/passwd", "runs/./x", "runs//x", ""])
def test_a_path_that_leaves_the_folder_or_is_not_plain_is_refused_when_bound(tmp_path: Path, bad: str) -> None:
    with pytest.raises(EvidenceError):
        manifest(tmp_path, [bad])


def test_a_symlinked_file_is_refused_when_bound(tmp_path: Path) -> None:
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "job0000.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(EvidenceError, match="job0000.json is a symlink"):
        manifest(tmp_path / "root", ["job0000.json"])


def test_a_fifo_in_a_files_place_is_refused_without_hanging(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "job0000.json")
    with pytest.raises(EvidenceError, match="not a regular file"):
        manifest(tmp_path, ["job0000.json"])


def test_a_manifest_naming_a_path_outside_the_folder_fails_verify(setup: Any) -> None:
    setup.dir.mkdir(parents=True)
    (setup.dir.parent / "outside.json").write_text("{}")
    with AuditWriter.open(setup.dir, campaign=setup.campaign, key_path=setup.key, anchor_dir=setup.anchors) as log:
        bad = log.append("evidence", payload={"step": "x", "files": {"../outside.json": {
            "sha256": "0" * 64, "size": 2}}})
    result = verify(setup.dir, anchor=setup.anchor)
    assert not result.ok and result.bad_seq == bad.seq
    assert result.reason == "evidence path '../outside.json' has an empty, '.' or '..' part"
