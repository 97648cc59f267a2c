from __future__ import annotations

import random
from pathlib import Path

import yaml

from agent.base import CampaignState, GiveUp, HistoryEntry, Proposal
from agent.proposers.search import SearchProposer, serving_diff
from agent.spec import SearchConfig
from sandbox.workspace import Workspace


class FileTools:
    """Just enough Tools for the search proposer: it only reads serving.yaml."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reads: list[str] = []

    def read_file(self, path: str) -> str:
        self.reads.append(path)
        return (self.root / path).read_text()


def _state(config: dict[str, object], history: tuple[HistoryEntry, ...] = (), i: int = 1) -> CampaignState:
    return CampaignState(iteration=i, incumbent_ref="x", serving_config=config, incumbent_metrics=(),
                         baseline_metrics=(), history=history)


def test_each_point_is_a_serving_yaml_patch_that_applies(tmp_path: Path) -> None:
    src = tmp_path / "src" / "vllm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    ws = Workspace.create(tmp_path / "ws", serving={"max_num_seqs": 8, "enforce_eager": True}, source=src)
    proposer = SearchProposer(SearchConfig(space={"max_num_seqs": [8, 32]}))
    tools = FileTools(ws.root)
    proposal = proposer.propose(_state(ws.serving_config()), tools, rng=random.Random(0))  # type: ignore[arg-type]
    assert isinstance(proposal, Proposal) and tools.reads == ["serving.yaml"]
    assert "max_num_seqs: 8 -> 32" in proposal.hypothesis and proposal.predicted_speedup
    ws.apply_patch(proposal.patch)
    assert ws.serving_config() == {"max_num_seqs": 32, "enforce_eager": True}


def test_tried_points_are_skipped_so_a_resumed_search_goes_on(tmp_path: Path) -> None:
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump({"max_num_seqs": 8}))
    proposer = SearchProposer(SearchConfig(space={"max_num_seqs": [8, 16, 32]}))
    tools = FileTools(tmp_path)
    seen = []
    history: tuple[HistoryEntry, ...] = ()
    for i in range(1, 4):
        result = proposer.propose(_state({"max_num_seqs": 8}, history, i), tools,  # type: ignore[arg-type]
                                  rng=random.Random(i))
        if isinstance(result, GiveUp):
            assert "exhausted" in result.reason
            break
        seen.append(result.source)
        history += (HistoryEntry(iteration=i, hypothesis=result.hypothesis, outcome="rejected", source=result.source),)
    assert sorted(seen) == ['search:{"max_num_seqs": 16}', 'search:{"max_num_seqs": 32}']


def test_the_same_iteration_proposes_the_same_point() -> None:
    proposer = SearchProposer(SearchConfig(space={"a": [1, 2, 3, 4], "b": [True, False]}, seed=7))
    points = [list(proposer._points({"a": 1, "b": True}, random.Random("7:3"))) for _ in range(2)]
    assert points[0] == points[1]


def test_grid_strategy_walks_the_space_in_order() -> None:
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"a": [1, 2], "b": [False, True]}))
    points = list(proposer._points({"a": 1, "b": False}, random.Random(0)))
    assert points == [{"a": 1, "b": False}, {"a": 1, "b": True}, {"a": 2, "b": False}, {"a": 2, "b": True}]


def test_serving_diff_is_git_style() -> None:
    diff = serving_diff("a: 1\n", "a: 2\n")
    assert diff.startswith("diff --git a/serving.yaml b/serving.yaml\n--- a/serving.yaml\n+++ b/serving.yaml\n")
    assert serving_diff("a: 1\n", "a: 1\n") == ""


def test_the_baseline_point_is_never_proposed_again(tmp_path: Path) -> None:
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump({"max_num_seqs": 8}))
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"max_num_seqs": [1, 8]}))
    state = CampaignState(iteration=2, incumbent_ref="x", serving_config={"max_num_seqs": 8}, incumbent_metrics=(),
                          baseline_metrics=(), baseline_serving_config={"max_num_seqs": 1})
    result = proposer.propose(state, FileTools(tmp_path), rng=random.Random(0))  # type: ignore[arg-type]
    assert isinstance(result, GiveUp) and "exhausted" in result.reason


def test_a_round_of_parallel_slots_gets_distinct_points_from_the_pending_ones(tmp_path: Path) -> None:
    """The loop asks once per slot, passing the round's earlier proposals as `pending` history."""
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump({"max_num_seqs": 8}))
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"max_num_seqs": [8, 16, 32, 64]}))
    pending: tuple[HistoryEntry, ...] = ()
    for i in (1, 2, 3):
        result = proposer.propose(_state({"max_num_seqs": 8}, pending, i), FileTools(tmp_path),  # type: ignore[arg-type]
                                  rng=random.Random(i))
        assert isinstance(result, Proposal)
        pending += (HistoryEntry(iteration=i, hypothesis=result.hypothesis, outcome="pending", source=result.source),)
    assert [h.source for h in pending] == ['search:{"max_num_seqs": 16}', 'search:{"max_num_seqs": 32}',
                                           'search:{"max_num_seqs": 64}']
