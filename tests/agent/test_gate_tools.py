"""The loop's door to the gate: every look and every patch decided and logged before it happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import ActionDenied, BudgetExhausted
from agent.gatekeeper import Gatekeeper
from agent.tools import GatedTools
from audit import AuditWriter, verify
from audit.reader import read_records
from policies import load_policy, redecider
from sandbox.errors import PatchRejected
from sandbox.workspace import Workspace
from tests.conftest import ROOT

POLICY = ROOT / "policies" / "default.yaml"


@pytest.fixture
def small_ws(tmp_path: Path) -> Workspace:
    src = tmp_path / "src" / "vllm"
    (src / "model_executor" / "models").mkdir(parents=True)
    (src / "model_executor" / "models" / "gemma4.py").write_text("SCALE = 1.0\n\ndef f(x):\n    return x * SCALE\n")
    (src / "benchmarks").mkdir()
    (src / "benchmarks" / "serve.py").write_text("TIMER = None\n")
    return Workspace.create(tmp_path / "ws", serving={"max_num_seqs": 8}, source=src)


@pytest.fixture
def gate(tmp_path: Path, small_ws: Workspace) -> Gatekeeper:
    writer = AuditWriter.open(tmp_path / "log", campaign="t-1", key_path=tmp_path / "key", anchor_dir=tmp_path / "a")
    return Gatekeeper(policy=load_policy(POLICY), writer=writer, root=small_ws.root,
                      limits={"llm_tokens": 1000, "wall_seconds": 100})


def _diff(path: str, old: str, new: str) -> str:
    """A one-line change at the top of a file, with the file's real trailing context."""
    context = " \n def f(x):\n     return x * SCALE\n" if "models" in path else ""
    count = 4 if context else 1
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{count} +1,{count} @@\n"
            f"-{old}\n+{new}\n{context}")


def test_reads_are_decided_and_logged_before_they_happen(gate: Gatekeeper, small_ws: Workspace,
                                                         tmp_path: Path) -> None:
    tools = GatedTools(gate=gate, root=small_ws.root, iteration=1)
    assert "SCALE" in tools.read_file("vllm/model_executor/models/gemma4.py")
    assert tools.list_files("vllm") == ["vllm/benchmarks/", "vllm/model_executor/"]
    assert tools.search(r"SCALE\b", "vllm")[0].startswith("vllm/model_executor/models/gemma4.py:1:")
    with pytest.raises(ActionDenied, match="deny-git"):
        tools.read_file(".git/config")
    gate.writer.close()
    actions = [r for r in read_records(tmp_path / "log") if r["kind"] == "action"]
    assert [r["decision"] for r in actions] == ["allow", "allow", "allow", "deny"]
    assert verify(tmp_path / "log", redecide=redecider([load_policy(POLICY)])).ok


def test_a_patch_to_an_allowed_file_is_checked_and_one_to_the_benchmarks_denied(
        gate: Gatekeeper, small_ws: Workspace) -> None:
    tools = GatedTools(gate=gate, root=small_ws.root, iteration=1)
    good = _diff("vllm/model_executor/models/gemma4.py", "SCALE = 1.0", "SCALE = 1.0  # same")
    assert tools.check_patch(good) == good
    with pytest.raises(ActionDenied, match="deny-benchmarks"):
        tools.check_patch(_diff("vllm/benchmarks/serve.py", "TIMER = None", "TIMER = 1"))
    with pytest.raises(PatchRejected, match="git apply --check failed"):
        tools.check_patch(_diff("vllm/model_executor/models/gemma4.py", "SCALE = 2.0", "SCALE = 3.0"))
    assert small_ws.is_clean()   # checking never writes


def test_a_timer_edit_in_an_allowed_file_is_denied(gate: Gatekeeper, small_ws: Workspace) -> None:
    tools = GatedTools(gate=gate, root=small_ws.root, iteration=1)
    with pytest.raises(ActionDenied, match="timer"):
        tools.check_patch(_diff("vllm/model_executor/models/gemma4.py", "SCALE = 1.0",
                                "import time; SCALE = time.perf_counter()"))


def test_spending_past_the_campaign_budget_stops_the_campaign(gate: Gatekeeper) -> None:
    gate.spend("llm_tokens", 600, iteration=1)
    assert gate.left("llm_tokens") == 400
    with pytest.raises(BudgetExhausted, match="llm_tokens"):
        gate.spend("llm_tokens", 500, iteration=1)
    assert gate.left("llm_tokens") == 0
