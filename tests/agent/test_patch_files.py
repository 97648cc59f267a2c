"""The `patches` proposer: given patch files, proposed in order through the same gate, checks and verdict."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.base import GiveUp, HistoryEntry, Proposal
from agent.proposers.patch_files import PatchFilesProposer, patch_source
from agent.spec import SpecError, load_spec
from audit.reader import payload_of, read_records
from tests.fake_campaign import gemma4_patch, start, write_target
from tests.fakes import FakeTools, make_state


def _serving_patch(new: int) -> str:
    return ("diff --git a/serving.yaml b/serving.yaml\n--- a/serving.yaml\n+++ b/serving.yaml\n"
            f"@@ -1,2 +1,2 @@\n enforce_eager: true\n-max_num_seqs: 1\n+max_num_seqs: {new}\n")


def test_files_are_proposed_in_order_with_their_comment_as_hypothesis_then_it_gives_up(tmp_path: Path) -> None:
    first, second = tmp_path / "vendor.patch", tmp_path / "plain.patch"
    first.write_text("# The vendor's claim: batching 8 sequences\n# doubles throughput.\n" + _serving_patch(8))
    second.write_text(_serving_patch(4))
    proposer = PatchFilesProposer([first, second])
    got = proposer.propose(make_state(), FakeTools(), rng=random.Random(0))
    assert isinstance(got, Proposal) and got.patch == _serving_patch(8)          # the comment is not the diff
    assert got.hypothesis == "The vendor's claim: batching 8 sequences doubles throughput."
    done = HistoryEntry(iteration=1, hypothesis=got.hypothesis, outcome="rejected", source=got.source)
    again = proposer.propose(make_state(history=(done,)), FakeTools(), rng=random.Random(0))
    assert isinstance(again, Proposal) and again.source == patch_source(second, second.read_text())
    assert again.hypothesis == "the change in plain.patch"
    both = (done, HistoryEntry(iteration=2, hypothesis="", outcome="accepted", source=again.source))
    assert isinstance(proposer.propose(make_state(history=both), FakeTools(), rng=random.Random(0)), GiveUp)


def test_a_serving_campaign_puts_each_file_through_the_verdict(tmp_path: Path) -> None:
    faster, broken = tmp_path / "faster.patch", tmp_path / "broken.patch"
    faster.write_text("# 8 sequences per batch\n" + _serving_patch(8))
    broken.write_text("# a kernel that changes the answers\n" + gemma4_patch("BREAKS_PARITY = 1"))
    spec = write_target(tmp_path, iterations=3, extra="")
    text = spec.read_text().replace(
        "proposer: {kind: search, search: {strategy: grid, space: {max_num_seqs: [4, 8, 16]}}}",
        f"proposer: {{kind: patches, patches: [{faster.name}, {broken.name}]}}")
    spec.write_text(text)
    loaded = load_spec(spec)
    assert loaded.proposer.patches == [faster.resolve(), broken.resolve()]     # relative to the spec file
    end = start(spec, tmp_path / "logs", tmp_path / "ws", proposer=PatchFilesProposer(loaded.proposer.patches))
    assert end.accepted == [patch_source(faster, faster.read_text())]
    results = [payload_of(end.log_dir, r) for r in read_records(end.log_dir) if r["kind"] == "iteration.result"]
    assert [r["outcome"] for r in results] == ["accepted", "parity-broken", "invalid"], results
    assert "real divergence" in results[1]["reason"] and results[2]["reason"].startswith("gave up: every patch")
    assert end.verdict.status == "improved"


def test_a_spec_with_kind_patches_and_no_files_is_refused(tmp_path: Path) -> None:
    spec = write_target(tmp_path)
    spec.write_text(spec.read_text().replace(
        "proposer: {kind: search, search: {strategy: grid, space: {max_num_seqs: [4, 8, 16]}}}",
        "proposer: {kind: patches}"))
    with pytest.raises(SpecError, match="proposer.patches"):
        load_spec(spec)
