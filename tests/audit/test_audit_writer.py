"""The writer: canonical chained records on disk before append returns, one writer, keys, recovery."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from audit import AuditKeyError, AuditWriteError, AuditWriter, LogFormatError, LogLockedError, verify
from audit.canon import genesis, sha256_hex

REPO = Path(__file__).resolve().parents[2]


def _open(setup: Any, **kwargs: Any) -> AuditWriter:
    return AuditWriter.open(
        setup.dir, campaign=setup.campaign, key_path=setup.key, anchor_dir=setup.anchors, **kwargs
    )


def _lines(setup: Any) -> list[bytes]:
    return (setup.dir / "log.jsonl").read_bytes().splitlines(keepends=True)


def test_a_record_is_on_disk_chained_and_canonical_when_append_returns(setup: Any) -> None:
    log = _open(setup)
    appended = log.append(
        "action",
        iteration=2,
        action_id="2.1",
        payload={"b": 1, "a": [1.5]},
        decision="deny",
        rule="deny-tests",
        policy_sha256="0" * 64,
    )
    lines = _lines(setup)  # read while the writer is still open
    record = json.loads(lines[-1])
    assert appended.seq == 1 and appended.sha256 == sha256_hex(lines[-1])
    assert lines[-1] == json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert record["prev"] == sha256_hex(lines[0]) and json.loads(lines[0])["prev"] == genesis("c1")
    assert (record["iteration"], record["action_id"], record["decision"], record["rule"]) == (
        2,
        "2.1",
        "deny",
        "deny-tests",
    )
    assert record["ts"].endswith("Z") and record["kind"] == "action"
    log.close()
    assert json.loads(_lines(setup)[-1])["kind"] == "checkpoint"
    assert verify(setup.dir, pubkey=setup.key, anchor=setup.anchor).ok


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(setup: Any) -> None:
    first = _open(setup)
    with pytest.raises(LogLockedError):
        _open(setup)
    code = (
        "import sys; from pathlib import Path; from audit import AuditWriter, LogLockedError\n"
        "try:\n"
        f"    AuditWriter.open(Path({str(setup.dir)!r}), campaign='c1', key_path=Path({str(setup.key)!r}))\n"
        "except LogLockedError: sys.exit(7)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 7
    first.close()
    second = _open(setup)
    assert second.next_seq == 3  # log.open, checkpoint, then the second writer's log.open
    second.close()
    assert verify(setup.dir).ok


def test_the_key_is_created_private_and_its_public_half_lands_in_the_log_dir(setup: Any) -> None:
    _open(setup).close()
    assert stat.S_IMODE(setup.key.stat().st_mode) == 0o600
    assert (setup.dir / "audit-key.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_a_key_readable_by_others_is_refused(setup: Any) -> None:
    _open(setup).close()
    setup.key.chmod(0o644)
    with pytest.raises(AuditKeyError, match="chmod 600"):
        _open(setup)


def test_continuing_a_log_with_another_key_is_refused(setup: Any, tmp_path: Path) -> None:
    _open(setup).close()
    with pytest.raises(AuditKeyError, match="another public key"):
        AuditWriter.open(setup.dir, campaign="c1", key_path=tmp_path / "other.key", anchor_dir=setup.anchors)


def test_continuing_another_campaigns_log_is_refused(setup: Any) -> None:
    _open(setup).close()
    with pytest.raises(LogFormatError, match="belongs to campaign"):
        AuditWriter.open(setup.dir, campaign="c2", key_path=setup.key, anchor_dir=setup.anchors)


@pytest.mark.parametrize("torn", [b'{"v":1,"seq":3,"pre', b"\x00\x00\x00\x00\n", b'{"kind":"x"}\n'])
def test_a_torn_last_line_is_moved_aside_and_recorded(setup: Any, torn: bytes) -> None:
    _open(setup).close()
    before = (setup.dir / "log.jsonl").read_bytes()
    with (setup.dir / "log.jsonl").open("ab") as handle:
        handle.write(torn)
    _open(setup).close()
    assert (setup.dir / "log.jsonl.torn-0").read_bytes() == torn
    after = (setup.dir / "log.jsonl").read_bytes()
    assert after.startswith(before)  # nothing before the torn bytes was rewritten
    recovery = json.loads(after[len(before) :].splitlines()[0])
    assert recovery["kind"] == "recovery"
    assert recovery["payload"] == {
        "torn_file": "log.jsonl.torn-0",
        "torn_offset": len(before),
        "torn_size": len(torn),
        "torn_sha256": sha256_hex(torn),
    }
    assert verify(setup.dir, anchor=setup.anchor).ok


def test_a_write_error_raises_and_breaks_the_writer(setup: Any) -> None:
    log = _open(setup)
    os.close(log._log_fd)  # a real failure: the descriptor is gone (EBADF)
    log._log_fd = os.open(os.devnull, os.O_RDONLY)  # a real file that refuses writes
    with pytest.raises(AuditWriteError, match="append failed"):
        log.append("action", payload={"x": 1})
    with pytest.raises(AuditWriteError, match="closed or broken"):
        log.append("action", payload={"x": 2})
    log.close()


def test_a_payload_that_is_not_json_raises_before_writing(setup: Any) -> None:
    with _open(setup) as log:
        size = (setup.dir / "log.jsonl").stat().st_size
        with pytest.raises(AuditWriteError, match="canonical"):
            log.append("iteration.result", payload={"speedup": float("nan")})
        with pytest.raises(AuditWriteError, match="schema"):
            log.append("Bad Kind!", payload={})
        assert (setup.dir / "log.jsonl").stat().st_size == size


def test_large_payloads_become_content_addressed_blobs(setup: Any) -> None:
    with _open(setup, blob_threshold=1024) as log:
        log.append("profile", payload={"trace": "k" * 5000})
        log.append("small", payload={"x": 1})
    records = [json.loads(line) for line in _lines(setup)]
    blob = records[1]
    assert "payload" not in blob and blob["payload_size"] > 5000
    assert (setup.dir / "blobs" / "sha256" / blob["payload_sha256"]).is_file()
    assert records[2]["payload"] == {"x": 1}
    assert verify(setup.dir).ok


def test_each_checkpoint_refreshes_the_anchor_outside_the_log(setup: Any) -> None:
    with _open(setup) as log:
        first = log.checkpoint()
        assert json.loads(setup.anchor.read_text())["seq"] == first.seq
        log.append("note", payload={})
    assert json.loads(setup.anchor.read_text())["seq"] == 3


def test_invalid_campaign_ids_are_refused(setup: Any) -> None:
    with pytest.raises(Exception, match="campaign id"):
        AuditWriter.open(setup.dir, campaign="../evil", key_path=setup.key)


def test_events_flow_through_structlog_and_can_be_echoed(setup: Any) -> None:
    with capture_logs() as logs, _open(setup, echo=True) as log:
        log.append("action", payload={}, decision="allow", rule="r")
    assert [entry["event"] for entry in logs][:2] == ["log.open", "action"]


def test_a_header_lands_on_the_logs_first_line(setup: Any) -> None:
    """The campaign names its isolation level on the log's first line (log.open), before anything runs."""
    with _open(setup, header={"isolation": "docker (own network, read-only root, uid 10001, no capabilities)"}):
        pass
    first = json.loads((setup.dir / "log.jsonl").read_text().splitlines()[0])
    assert first["kind"] == "log.open" and first["payload"]["isolation"].startswith("docker")
    assert verify(setup.dir).ok
