"""try_patch without vLLM: the agent's side (a scripted model over real HTTP that reacts to what a trial
returned), the gate and budget around a trial, and what a trial reports for a crash and for a measurement.
The same sequence against real vLLM servers is in tests/agent/test_campaign_vllm.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from agent.base import Proposal
from agent.campaign import _limits
from agent.errors import ActionDenied
from agent.gatekeeper import Gatekeeper
from agent.measurements import HARNESS
from agent.proposers.llm import LLMConfig, LLMProposer
from agent.spec import load_spec
from agent.tools import GatedTools
from agent.trial import Trials
from audit import AuditWriter
from audit.reader import payload_of, read_records
from harness.errors import ServerCrashed
from harness.measure import ABResult, GridResult
from harness.parity import ParityReport
from harness.server import failure_excerpt
from harness.stats import SpeedupCI
from policies import load_policy
from sandbox.workspace import Workspace
from tests.agent.test_llm_proposer import GEMMA, gemma_diff, tools
from tests.fakes import Reply, ScriptedOpenAIServer, call, make_state, reply

CRASH_LOG = """INFO 12-01 starting
(EngineCore pid=12) ERROR Traceback (most recent call last):
(EngineCore pid=12) ERROR   File "vllm/model_executor/models/gemma4.py", line 7, in forward
(EngineCore pid=12) ERROR     up = self.up_proj(x) * SCALE
(EngineCore pid=12) ERROR NameError: name 'SCALE' is not defined
(APIServer pid=1) ERROR RuntimeError: Engine core initialization failed. See root cause above.
"""
BROKEN = gemma_diff(new="        up = self.up_proj(x) * SCALE\n")
FIXED = gemma_diff()


def _trial_text(diff: str) -> str:
    if "SCALE" in diff:
        return ("try_patch (41 s, cells in64/out8)\nparity: not known: the trial did not get that far\n"
                "hint: none: the trial failed before it measured anything\n"
                "failure: ServerCrashed: server exited with code 1 during start-up\nserver log:\n" + CRASH_LOG)
    return ("try_patch (97 s, cells in64/out8)\nparity: parity ok: 4/4 prompts identical (visible prompts)\n"
            "hint: candidate vs incumbent 1.04x [0.9, 1.2]; a hint, not a verdict")


def _react_to_the_traceback(body: dict[str, Any]) -> Reply:
    """The scripted model reads the last tool result: a traceback naming the undefined name -> it fixes it."""
    last = [m["content"] for m in body["messages"] if m.get("role") == "tool"][-1]
    if "server log:" in last and "NameError: name 'SCALE' is not defined" in last:
        return reply(call("try_patch", patch=FIXED, format="diff", cells=["in64/out8"]))
    return reply(call("give_up", reason=f"did not see the traceback: {last[:200]}"))


def test_the_agent_reads_a_trials_traceback_fixes_its_patch_and_proposes_the_fix() -> None:
    fake = tools(trial_results=[_trial_text, _trial_text])
    script = [
        reply(call("try_patch", patch=BROKEN, format="diff", cells=["in64/out8"])),
        _react_to_the_traceback,
        reply(call("propose_patch", hypothesis="scale-free up projection", patch=FIXED, format="diff",
                   predicted_speedup=1.04)),
        reply(call("submit")),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = LLMProposer(LLMConfig(base_url=server.base_url, model="scripted", max_retries=0)).propose(
            make_state(), fake, rng=random.Random(0))
        tool_results = server.tool_results(2)
    assert isinstance(result, Proposal) and result.patch == FIXED
    tried = [args["patch"] for name, args in fake.calls if name == "try_patch"]
    assert tried == [BROKEN, FIXED]
    assert "Traceback (most recent call last)" in tool_results[0] and "parity: parity ok" in tool_results[1]
    # the failed trial is an audited tool error; the passing one is not
    (error,) = fake.notes_of("llm.tool_error")
    assert error["tool"] == "try_patch" and "NameError" in str(error["result"])


def test_an_identical_trial_is_answered_from_the_first_without_running_again() -> None:
    fake = tools(trial_results=[_trial_text])          # one result: a second run would fail the test
    script = [reply(call("try_patch", patch=BROKEN)), reply(call("try_patch", patch=BROKEN)),
              reply(call("give_up", reason="stuck"))]
    with ScriptedOpenAIServer(script) as server:
        LLMProposer(LLMConfig(base_url=server.base_url, model="scripted", max_retries=0)).propose(
            make_state(), fake, rng=random.Random(0))
        second = server.tool_results(2)[-1]
    assert second.startswith("REPEATED: you tried exactly this patch already") and "NameError" in second
    assert fake.spent["trials"] == 1


def test_a_third_identical_call_is_refused_with_a_note_to_do_something_else() -> None:
    fake = tools()
    script = [reply(call("read_file", path=GEMMA)) for _ in range(3)] + [reply(call("give_up", reason="x"))]
    with ScriptedOpenAIServer(script) as server:
        LLMProposer(LLMConfig(base_url=server.base_url, model="scripted", max_retries=0)).propose(
            make_state(), fake, rng=random.Random(0))
        results = [server.tool_results(k)[-1] for k in (1, 2, 3)]
    assert results[0].startswith(GEMMA) and results[1].startswith(GEMMA)
    assert results[2].startswith("REPEATED: this is call 3 of read_file")
    assert [name for name, _ in fake.calls].count("read_file") == 2


def test_trials_left_are_shown_and_a_spent_budget_refuses_the_tool_not_the_iteration() -> None:
    fake = tools(trial_results=[_trial_text, _trial_text], budgets={"trials": 1})
    script = [reply(call("try_patch", patch=FIXED)), reply(call("try_patch", patch=BROKEN)),
              reply(call("propose_patch", hypothesis="h", patch=FIXED)), reply(call("submit"))]
    with ScriptedOpenAIServer(script) as server:
        result = LLMProposer(LLMConfig(base_url=server.base_url, model="scripted", max_retries=0)).propose(
            make_state(budget_left={"trials": 1.0}), fake, rng=random.Random(0))
        system = server.requests[0]["messages"][0]["content"]
        refused = server.tool_results(2)[-1]
    assert "(1 left)" in system and "try_patch(patch, format, cells)" in system
    assert refused.startswith("DENIED by policy rule budget-limit")
    assert isinstance(result, Proposal)


# ----------------------------------------------------------------------------- the gate and the runner

SPEC = """
schema_version: 1
name: trials
server: {model: m, engine_args: {max_num_seqs: 1}}
benchmark: {input_lens: [8, 16], output_lens: [4], prefill: true}
parity: {prompts: held.jsonl, visible_prompts: visible.jsonl}
budget: {max_iterations: 1, trials: 2}
"""
SERVING = ("diff --git a/serving.yaml b/serving.yaml\n--- a/serving.yaml\n+++ b/serving.yaml\n"
           "@@ -1 +1 @@\n-max_num_seqs: 1\n+max_num_seqs: 4\n")


@pytest.fixture
def room(tmp_path: Path) -> Any:
    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yaml")
    src = tmp_path / "src" / "vllm"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    ws = Workspace.create(tmp_path / "ws", serving=dict(spec.server.engine_args), source=src)
    with AuditWriter.open(tmp_path / "log", campaign="trials", anchor_dir=tmp_path / "anchors") as writer:
        gate = Gatekeeper(policy=load_policy(spec.policy), writer=writer, root=ws.root, limits=_limits(spec))
        trials = Trials(spec=spec, workspace=ws, backend=None, gate=gate, writer=writer,  # type: ignore[arg-type]
                        log_dir=tmp_path / "log")
        yield spec, ws, gate, trials, tmp_path / "log"


def _fake_ab(seen: list[dict[str, Any]], *, crash: bool = False) -> Any:
    def ab_compare(backend: Any, a: Any, b: Any, **kw: Any) -> ABResult:
        seen.append({"a": a, "b": b, **kw, "b_serving": (b.tree / "serving.yaml").read_text()})
        if crash:
            log = kw["work_dir"] / "server-B.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(CRASH_LOG)
            raise ServerCrashed(f"server exited with code 1 during start-up; from {log}:\n{failure_excerpt(log)}")
        ci = SpeedupCI(1.21, 0.95, 1.5, 2)
        return ABResult(a=GridResult(build=a, startup_s=1.0, evidence={}),
                        b=GridResult(build=b, startup_s=1.0, evidence={}),
                        parity=ParityReport((), "x", "x"), cells={"in16/out4": {"headline": ci}}, overall=ci)
    return ab_compare


def test_a_trial_is_gated_charged_measured_on_visible_prompts_and_recorded(room: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    spec, ws, gate, trials, log = room
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(HARNESS, "ab", _fake_ab(seen))
    tools = GatedTools(gate=gate, root=ws.root, iteration=1, trial=trials.for_iteration(1, ws.head()))
    text = tools.try_patch(SERVING, "diff", ["in16/out4"])
    assert "parity: parity ok" in text and "(visible prompts" in text
    assert "hint: candidate vs incumbent 1.210x" in text and "not a verdict" in text
    (ab,) = seen
    assert ab["parity"].prompts.name == "visible.jsonl"                 # never the held prompts
    assert [c.label for c in ab["cells"]] == ["in16/out4"] and ab["bench"].repeats == 2
    assert "max_num_seqs: 4" in ab["b_serving"] and ab["a"].engine_args == {"max_num_seqs": 1}
    assert not list((log / "runs" / "it001" / "try1").glob("tree-*"))  # scratch trees are gone
    records = read_records(log)
    kinds = [(r["kind"], json.dumps(payload_of(log, r).get("action", {}).get("kind"))) for r in records]
    assert ("action", '"patch"') in kinds and kinds.count(("action", '"start_server"')) == 2
    spend = [payload_of(log, r)["action"] for r in records
             if r["kind"] == "action" and payload_of(log, r)["action"]["kind"] == "spend"]
    assert spend == [{"kind": "spend", "resource": "trials", "amount": 1.0, "id": spend[0]["id"]}]
    (trial,) = [payload_of(log, r) for r in records if r["kind"] == "agent.try_patch"]
    assert trial["cells"] == ["in16/out4"] and trial["hint"].startswith("candidate vs incumbent 1.210x")


def test_a_crashing_trial_hands_back_the_traceback_and_unknown_cells_cost_nothing(
        room: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, ws, gate, trials, log = room
    monkeypatch.setattr(HARNESS, "ab", _fake_ab([], crash=True))
    tools = GatedTools(gate=gate, root=ws.root, iteration=2, trial=trials.for_iteration(2, ws.head()))
    with pytest.raises(ValueError, match="the grid's cells are in8/out4, in16/out4, in8/out1, in16/out1"):
        tools.try_patch(SERVING, "diff", ["in99/out4"])
    assert gate.spent.get("trials", 0) == 0
    text = tools.try_patch(SERVING)
    assert "failure: ServerCrashed" in text and "server log:\n(EngineCore pid=12) ERROR Traceback" in text
    assert "NameError: name 'SCALE' is not defined" in text and "Engine core initialization failed" in text
    tools.try_patch(SERVING)
    with pytest.raises(ActionDenied, match="trials: the campaign's budget of 2 is used up"):
        tools.try_patch(SERVING)
    assert gate.spent["trials"] == 2


def test_a_policy_without_a_trials_budget_denies_them(room: Any, tmp_path: Path) -> None:
    spec, ws, gate, trials, log = room
    strict = Gatekeeper(policy=load_policy(Path(__file__).parents[2] / "policies" / "strict.yaml"),
                        writer=gate.writer, root=ws.root, limits=_limits(spec))
    tools = GatedTools(gate=strict, root=ws.root, iteration=3, trial=trials.for_iteration(3, ws.head()))
    with pytest.raises(ActionDenied):
        tools.try_patch(SERVING)
    assert strict.spent.get("trials", 0) == 0
    with pytest.raises(ActionDenied, match="runs no trials"):
        GatedTools(gate=gate, root=ws.root, iteration=3).try_patch(SERVING)


def test_a_failure_excerpt_runs_from_the_first_traceback_and_keeps_head_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("noise\n" * 50 + CRASH_LOG + "".join(f"frame {i}\n" for i in range(2000)) + "THE END\n")
    text = failure_excerpt(log, 1000)
    assert text.startswith("(EngineCore pid=12) ERROR Traceback") and text.endswith("THE END")
    assert "characters cut" in text and len(text) < 1100
    log.write_text("line\n" * 40)
    assert failure_excerpt(log) == "\n".join(["line"] * 25)           # no traceback: the log's tail


def test_a_patch_that_changes_nothing_is_rejected_before_any_trial(room: Any) -> None:
    """Qwen2.5-Coder-1.5B's try_patch on the real workspace: a diff whose - and + lines are the same."""
    from sandbox.errors import PatchRejected

    spec, ws, gate, trials, log = room
    no_op = SERVING.replace("+max_num_seqs: 4", "+max_num_seqs: 1")
    tools = GatedTools(gate=gate, root=ws.root, iteration=4, trial=trials.for_iteration(4, ws.head()))
    with pytest.raises(PatchRejected, match="the patch changes nothing"):
        tools.try_patch(no_op)
    assert gate.spent.get("trials", 0) == 0
    assert tools.check_patch(SERVING) == SERVING                       # a real change still passes
