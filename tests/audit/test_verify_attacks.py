"""The attack table for the log: every edit, cut, reorder, splice, key swap or forged policy is found."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from audit import AuditWriter, verify
from policies import Ledger, action_payload, decide, load_policy, parse_action, policy_sha256, redecider

POLICY_DIR = Path(__file__).resolve().parents[2] / "policies"
Tools = dict[str, Callable[..., Any]]


def _redecide() -> Callable[[Any], str | None]:
    return redecider([load_policy(path) for path in sorted(POLICY_DIR.glob("*.yaml"))])


def _first_deny(records: list[dict[str, Any]]) -> int:
    return next(i for i, r in enumerate(records) if r.get("decision") == "deny" and i > 3)


def test_an_untouched_log_verifies_with_every_check(campaign: Any) -> None:
    result = verify(campaign.dir, pubkey=campaign.key, redecide=_redecide(), anchor=campaign.anchor)
    assert result.ok, result.reason
    assert result.records == 25 and result.checkpoints == 2
    assert result.summary() == "verified 25 records"


def test_a_middle_line_changed_from_deny_to_allow_is_reported_at_its_seq(campaign: Any, tools: Tools) -> None:
    lines = tools["lines"](campaign.dir)
    seq = _first_deny(tools["records"](campaign.dir))
    lines[seq] = lines[seq].replace(b'"decision":"deny"', b'"decision":"allow"')
    tools["write"](campaign.dir, lines)
    result = verify(campaign.dir)
    assert not result.ok and result.bad_seq == seq
    assert "was changed" in result.reason
    with_policy = verify(campaign.dir, redecide=_redecide())
    assert (with_policy.bad_seq, "policy decides 'deny'" in with_policy.reason) == (seq, True)


def test_a_rechained_deny_to_allow_edit_fails_the_signature(
    campaign: Any, tools: Tools, tmp_path: Path
) -> None:
    records = tools["records"](campaign.dir)
    seq = _first_deny(records)
    records[seq]["decision"] = "allow"
    tools["rewrite"](campaign.dir, records, key_path=tmp_path / "attacker.key")
    result = verify(campaign.dir, pubkey=campaign.key)
    assert not result.ok
    assert "different key" in result.reason or "signature" in result.reason
    # Even trusting the log's own (swapped) key, re-deciding finds the lie at its seq.
    redecided = verify(campaign.dir, redecide=_redecide())
    assert (redecided.ok, redecided.bad_seq) == (False, seq)


def test_a_swapped_signing_key_is_detected_with_the_trusted_key_and_the_anchor(
    campaign: Any, tools: Tools, tmp_path: Path
) -> None:
    tools["rewrite"](campaign.dir, tools["records"](campaign.dir), key_path=tmp_path / "attacker.key")
    assert verify(campaign.dir).ok  # self-consistent: why --pubkey / the anchor matter
    by_key = verify(campaign.dir, pubkey=campaign.key)
    assert not by_key.ok and "different key" in by_key.reason
    forged_pub = campaign.dir / "audit-key.pub"
    by_anchor = verify(campaign.dir, pubkey=forged_pub, anchor=campaign.anchor)
    assert not by_anchor.ok and "anchor" in by_anchor.reason


def test_a_tail_cut_without_its_checkpoint_is_detected(campaign: Any, tools: Tools) -> None:
    lines = tools["lines"](campaign.dir)
    tools["write"](campaign.dir, lines[:-3])
    result = verify(campaign.dir)
    assert not result.ok
    assert result.reason == "tail not covered by a checkpoint: possible truncation"
    assert result.bad_seq == len(lines) - 4


def test_a_killed_writers_unsigned_tail_is_allowed_only_as_asked_and_still_checked(
    setup: Any, tools: Tools
) -> None:
    """open_tail: what a resume reads (the records after the last checkpoint, a torn last line); the chain, the
    signatures before it and the anchor are still checked there."""
    log = AuditWriter.open(setup.dir, campaign="c1", key_path=setup.key, anchor_dir=setup.anchors)
    for n in range(3):
        log.append("note", payload={"n": n})
    signed = log.checkpoint().seq
    for n in range(3, 6):
        log.append("note", payload={"n": n})
    log.close(checkpoint=False)                  # what a kill leaves: records after the last checkpoint...
    with (setup.dir / "log.jsonl").open("ab") as handle:
        handle.write(b'{"v":1,"seq":')           # ...and an append cut short
    assert not verify(setup.dir, anchor=setup.anchor).ok
    assert verify(setup.dir, anchor=setup.anchor, open_tail=True).ok
    lines = tools["lines"](setup.dir)
    changed = list(lines)
    changed[signed + 1] = changed[signed + 1].replace(b'"n":3', b'"n":4')   # a record of the unsigned tail
    tools["write"](setup.dir, changed)
    result = verify(setup.dir, anchor=setup.anchor, open_tail=True)
    assert (result.ok, result.bad_seq) == (False, signed + 1), result
    tools["write"](setup.dir, lines[:signed])    # cut back before the anchored checkpoint
    cut = verify(setup.dir, anchor=setup.anchor, open_tail=True)
    assert not cut.ok and "truncated" in cut.reason


def test_a_tail_cut_back_to_an_earlier_checkpoint_is_detected_by_the_anchor(
    campaign: Any, tools: Tools
) -> None:
    lines = tools["lines"](campaign.dir)
    records = tools["records"](campaign.dir)
    first_checkpoint = next(i for i, r in enumerate(records) if r["kind"] == "checkpoint")
    tools["write"](campaign.dir, lines[: first_checkpoint + 1])
    assert verify(campaign.dir).ok  # a signed prefix: undetectable without an external anchor
    assert verify(campaign.dir).notes  # and verify says so
    anchored = verify(campaign.dir, anchor=campaign.anchor)
    assert not anchored.ok and "truncated" in anchored.reason
    expected = verify(campaign.dir, expect_seq=len(lines) - 1)
    assert not expected.ok and "truncated" in expected.reason


@pytest.mark.parametrize("how", ["swap", "duplicate", "drop-middle", "move-last-first"])
def test_reordered_duplicated_or_removed_records_are_detected(campaign: Any, tools: Tools, how: str) -> None:
    lines = tools["lines"](campaign.dir)
    if how == "swap":
        lines[5], lines[6] = lines[6], lines[5]
    elif how == "duplicate":
        lines.insert(6, lines[5])
    elif how == "drop-middle":
        del lines[5]
    else:
        lines.insert(0, lines.pop())
    tools["write"](campaign.dir, lines)
    result = verify(campaign.dir)
    assert not result.ok
    assert result.bad_seq is not None and result.bad_seq <= 6


def test_records_spliced_from_another_log_of_the_same_campaign_are_detected(
    campaign: Any, tools: Tools, tmp_path: Path
) -> None:
    other = type(campaign)(dir=tmp_path / "other", key=campaign.key, anchors=tmp_path / "a2", campaign="c1")
    tools["campaign"](other, iterations=3, policy_name="ask-example.yaml")
    mine, theirs = tools["lines"](campaign.dir), tools["lines"](other.dir)
    mine[7] = theirs[7]  # same seq, same campaign, same key: but another chain
    tools["write"](campaign.dir, mine)
    result = verify(campaign.dir, pubkey=campaign.key)
    assert not result.ok and result.bad_seq in (6, 7)


def test_records_spliced_from_another_campaign_are_detected(
    campaign: Any, tools: Tools, tmp_path: Path
) -> None:
    other = type(campaign)(dir=tmp_path / "other", key=campaign.key, anchors=tmp_path / "a2", campaign="c2")
    tools["campaign"](other)
    mine, theirs = tools["lines"](campaign.dir), tools["lines"](other.dir)
    tools["write"](campaign.dir, mine[:10] + theirs[10:])
    result = verify(campaign.dir)
    assert not result.ok and result.bad_seq == 10 and "campaign" in result.reason


def test_a_whole_log_from_another_campaign_fails_the_anchor(
    campaign: Any, tools: Tools, tmp_path: Path
) -> None:
    other = type(campaign)(dir=tmp_path / "other", key=campaign.key, anchors=tmp_path / "a2", campaign="c2")
    tools["campaign"](other)
    result = verify(other.dir, anchor=campaign.anchor)
    assert not result.ok and "anchor" in result.reason


def test_a_forged_policy_hash_is_detected_by_redecision(setup: Any, tools: Tools, tmp_path: Path) -> None:
    forged = tmp_path / "forged.yaml"
    forged.write_text(
        "schema_version: 1\nname: default\npaths:\n"
        "  - {id: allow-all, effect: allow, ops: [read, write], globs: ['**']}\n"
    )
    tools["campaign"](setup, iterations=1, policy_name=str(forged))
    assert verify(setup.dir, pubkey=setup.key).ok  # the chain itself is intact
    result = verify(setup.dir, pubkey=setup.key, redecide=_redecide())
    assert not result.ok and "matches no known policy" in result.reason


def test_a_recorded_policy_hash_swapped_for_a_known_one_is_detected(campaign: Any, tools: Tools) -> None:
    records = tools["records"](campaign.dir)
    strict = load_policy(POLICY_DIR / "strict.yaml")
    seq = next(i for i, r in enumerate(records) if r.get("decision") == "allow" and "layers" in json.dumps(r))
    records[seq]["policy_sha256"] = policy_sha256(strict)  # strict never allows writes to layers/
    tools["rewrite"](campaign.dir, records, key_path=campaign.key)  # even with the real key
    result = verify(campaign.dir, pubkey=campaign.key, redecide=_redecide())
    assert (result.ok, result.bad_seq) == (False, seq)


def test_a_non_canonical_line_is_detected(campaign: Any, tools: Tools) -> None:
    lines = tools["lines"](campaign.dir)
    lines[4] = json.dumps(json.loads(lines[4]), indent=None, separators=(", ", ": ")).encode() + b"\n"
    tools["write"](campaign.dir, lines)
    result = verify(campaign.dir)
    assert (result.ok, result.bad_seq) == (False, 4) and "canonical" in result.reason


def test_an_unknown_field_is_detected(campaign: Any, tools: Tools) -> None:
    records = tools["records"](campaign.dir)
    records[3]["approved_by"] = "nobody"
    tools["rewrite"](campaign.dir, records, key_path=campaign.key)
    result = verify(campaign.dir)
    assert (result.ok, result.bad_seq) == (False, 3) and "approved_by" in result.reason


def test_a_changed_or_missing_blob_is_detected(setup: Any) -> None:
    with AuditWriter.open(setup.dir, campaign="c1", key_path=setup.key, anchor_dir=setup.anchors) as log:
        log.append("profile", payload={"trace": "x" * 100_000})
    assert verify(setup.dir).ok
    blob = next((setup.dir / "blobs" / "sha256").iterdir())
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes().replace(b"xxx", b"xyx", 1))
    changed = verify(setup.dir)
    assert (changed.ok, changed.bad_seq) == (False, 1) and "does not match" in changed.reason
    blob.unlink()
    missing = verify(setup.dir)
    assert (missing.ok, missing.bad_seq) == (False, 1) and "missing" in missing.reason


def test_a_torn_last_line_is_reported(campaign: Any) -> None:
    with (campaign.dir / "log.jsonl").open("ab") as handle:
        handle.write(b'{"v":1,"seq":')
    result = verify(campaign.dir)
    assert (result.ok, result.bad_seq) == (False, 25) and "torn" in result.reason


def test_a_removed_torn_file_is_detected(setup: Any) -> None:
    with AuditWriter.open(setup.dir, campaign="c1", key_path=setup.key, anchor_dir=setup.anchors) as log:
        log.append("note", payload={"n": 1})
    with (setup.dir / "log.jsonl").open("ab") as handle:
        handle.write(b'{"v":1,"se')
    AuditWriter.open(setup.dir, campaign="c1", key_path=setup.key, anchor_dir=setup.anchors).close()
    assert verify(setup.dir, anchor=setup.anchor).ok
    (setup.dir / "log.jsonl.torn-0").unlink()
    result = verify(setup.dir)
    assert not result.ok and "torn tail" in result.reason


def test_a_decision_whose_action_was_stripped_is_detected(campaign: Any, tools: Tools) -> None:
    records = tools["records"](campaign.dir)
    seq = _first_deny(records)
    records[seq]["payload"] = {"reason": "nothing to see"}
    tools["rewrite"](campaign.dir, records, key_path=campaign.key)
    result = verify(campaign.dir, pubkey=campaign.key, redecide=_redecide())
    assert (result.ok, result.bad_seq) == (False, seq) and "cannot be re-decided" in result.reason


def test_a_large_decision_payload_in_a_blob_is_re_decided(setup: Any) -> None:
    policy = load_policy(POLICY_DIR / "default.yaml")
    gemma = "vllm/model_executor/models/gemma4.py"
    body = "".join(f"+x{i} = {i}\n" for i in range(8000))
    diff = f"diff --git a/{gemma} b/{gemma}\n--- a/{gemma}\n+++ b/{gemma}\n@@ -1 +1,8001 @@\n x\n{body}"
    action = parse_action({"kind": "patch", "diff": diff})
    decision = decide(policy, action, Ledger())
    assert decision.verdict == "allow"
    with AuditWriter.open(setup.dir, campaign="c1", key_path=setup.key, anchor_dir=setup.anchors) as log:
        log.append(
            "action",
            payload=action_payload(action, Ledger(), decision=decision),
            decision="deny",
            rule=decision.rule,
            policy_sha256=policy_sha256(policy),
        )
    assert json.loads(tools_lines(setup.dir)[1]).get("payload_sha256")
    result = verify(setup.dir, redecide=_redecide())
    assert (result.ok, result.bad_seq) == (False, 1) and "policy decides 'allow'" in result.reason


def tools_lines(directory: Path) -> list[bytes]:
    return (directory / "log.jsonl").read_bytes().splitlines()
