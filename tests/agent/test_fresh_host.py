"""A campaign survives its host: killed on one, resumed on another from a copy of its folder alone (agent/fresh_host.py,
agent/rebuild.py, agent/host.py), through the fake measurement seam (tests/fake_measurements.py), without vLLM.

"Another host" here: a fresh `git clone` of this repository at another path (the spec's files found there, the
workspace rebuilt there from the log), a fresh HOME with only the signing key carried by $RATCHET_AUDIT_KEY, and a host
probe that names another machine with the same accelerator and software. What differs in kind is refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import git
import pytest

from agent.cli import main
from agent.errors import CampaignError
from agent.host import Host, differences, host_of_start, probe_host
from agent.journal import Committed, Journal, read_journal
from agent.rebuild import open_or_rebuild
from audit import anchor_path
from audit.keys import load_or_create_key
from audit.reader import payload_of, read_records
from audit.verify import verify
from tests.conftest import ROOT, TINY_MODEL, processes_under
from tests.fake_campaign import killed_at, resume, start, write_target


def _payloads(log_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [payload_of(log_dir, r) for r in read_records(log_dir) if r["kind"] == kind]


def _accepted(log_dir: Path) -> list[str]:
    return [p["source"] for p in _payloads(log_dir, "iteration.result") if p["accepted"]]


def _git(*argv: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=cwd, check=True,
                   capture_output=True, timeout=120)


def _checkout_with_target(dest: Path) -> tuple[Path, Path]:
    """A clone of this repository with the fake target (spec, prompts, source) committed into it, every path in the
    spec relative to the spec file as a user's would be. Returns (the clone, its spec)."""
    _git("clone", "--quiet", str(ROOT), str(dest), cwd=ROOT)
    folder = dest / "experiments" / "fake-resume"
    spec = write_target(folder)
    spec.write_text(spec.read_text().replace(f"{folder}/", "").replace(str(TINY_MODEL), "../models/gemma4-tiny"))
    assert str(dest) not in spec.read_text()
    _git("add", "experiments/fake-resume", cwd=dest)
    _git("commit", "-q", "-m", "the fake target", cwd=dest)
    return dest, spec


def _host_b() -> Host:
    return dataclasses.replace(probe_host(), name="host-b", machine_id="b" * 32)


def _home(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("RATCHET_AUDIT_KEY", raising=False)
    return path


@pytest.mark.timeout(300)
def test_a_campaign_killed_on_one_host_resumes_from_a_copy_of_its_folder_in_a_fresh_clone_to_the_same_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # host A: a checkout, its HOME with the key made at start; killed while proposing iteration 2 (1 is accepted)
    home_a = _home(tmp_path / "home-a", monkeypatch)
    clone_a, spec_a = _checkout_with_target(tmp_path / "host-a" / "ratchet")
    code = killed_at("propose:2", ["start", str(spec_a), str(clone_a / "audit_logs"),
                                   str(clone_a / ".ratchet" / "workspaces")])
    assert code == -9
    (killed,) = [p.parent for p in (clone_a / "audit_logs").glob("*/log.jsonl")]
    (first,) = _accepted(killed)
    assert '"max_num_seqs": 4' in first
    commit_a = _payloads(killed, "iteration.result")[0]["commit"]
    uninterrupted = start(spec_a, tmp_path / "uninterrupted" / "logs", tmp_path / "uninterrupted" / "ws")

    # host B: a fresh clone elsewhere, a fresh HOME; the folder and the key are all that is carried
    clone_b = tmp_path / "host-b" / "ratchet"
    _git("clone", "--quiet", str(clone_a), str(clone_b), cwd=tmp_path)
    log_dir = clone_b / "audit_logs" / killed.name
    shutil.copytree(killed, log_dir)
    carried = tmp_path / "carried" / "audit-key.ed25519"
    carried.parent.mkdir()
    shutil.copy2(home_a / ".config" / "ratchet" / "audit-key.ed25519", carried)
    (tmp_path / "host-a").rename(tmp_path / "host-a-gone")    # nothing of host A's checkout is there to read
    home_b = _home(tmp_path / "home-b", monkeypatch)
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(carried))

    end = resume(log_dir, probe=_host_b, checkout=clone_b)
    assert end.verdict.status == uninterrupted.verdict.status == "improved"
    assert _accepted(log_dir) == _accepted(uninterrupted.log_dir) and len(_accepted(log_dir)) == 2
    assert _accepted(log_dir)[0] == first
    assert end.final is not None and uninterrupted.final is not None
    assert end.final.overall == uninterrupted.final.overall

    (host,) = _payloads(log_dir, "campaign.host")
    assert host["host"]["name"] == "host-b" and host["previous"] == f"{probe_host().name} ({probe_host().accelerator})"
    assert host["moved"] == {str(clone_a): str(clone_b)} and host["key"]["key"] == str(carried)
    assert host["anchor_note"] and host["key"]["anchor"] is None          # no anchor was carried: said so
    (resumed,) = _payloads(log_dir, "campaign.resume")
    workspace = clone_b / ".ratchet" / "workspaces" / killed.name
    assert resumed["workspace"] == {"path": str(workspace), "rebuilt": True, "commits": [commit_a]}
    base = _payloads(log_dir, "campaign.start")[0]["base_commit"]
    branch = [c.hexsha for c in git.Repo(workspace).iter_commits(f"{base}..ratchet/{killed.name}")]
    assert branch[-1] == commit_a and len(branch) == 2          # the same commit as on host A, then iteration 2's

    # the log verifies across both hosts' records: with its key, with this host's anchor, with the original's
    assert verify(log_dir, pubkey=carried).ok
    assert verify(log_dir, anchor=anchor_path(carried.parent / "anchors", killed.name)).ok
    assert verify(log_dir, anchor=anchor_path(home_a / ".config" / "ratchet" / "anchors", killed.name)).ok
    assert not (home_b / ".config").exists()                              # no key was made on host B
    assert not processes_under(log_dir)


def _killed_log(tmp_path: Path, point: str = "propose:1") -> tuple[Path, Path]:
    """A campaign killed after its baseline, on a copy of the tiny model it can change. Returns (log, spec)."""
    model = tmp_path / "model"
    shutil.copytree(TINY_MODEL, model)
    spec = write_target(tmp_path)
    spec.write_text(spec.read_text().replace(str(TINY_MODEL), str(model)))
    assert killed_at(point, ["start", str(spec), str(tmp_path / "logs"), str(tmp_path / "ws")]) == -9
    (log_dir,) = [p.parent for p in (tmp_path / "logs").glob("*/log.jsonl")]
    return log_dir, spec


def test_a_host_of_another_kind_or_without_what_the_log_needs_is_refused_with_why_and_nothing_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = _home(tmp_path / "home", monkeypatch)
    log_dir, spec = _killed_log(tmp_path)
    text = (log_dir / "log.jsonl").read_text()
    here = probe_host()

    def refused(match: str, **kw: Any) -> str:
        with pytest.raises(CampaignError, match=match) as info:
            resume(log_dir, **kw)
        assert (log_dir / "log.jsonl").read_text() == text, match      # nothing written
        return " ".join(str(info.value).split())

    other_gpu = refused("not the kind", probe=lambda: dataclasses.replace(here, accelerator="NVIDIA H200"))
    assert f"accelerator: {here.accelerator} recorded, NVIDIA H200 here" in other_gpu
    other_torch = refused("not the kind", probe=lambda: dataclasses.replace(
        here, name="elsewhere", software={**here.software, "torch": "9.9.9+cu999"}))
    assert f"torch: {here.software['torch']} recorded, 9.9.9+cu999 here" in other_torch

    missing = tmp_path / "no-key" / "audit-key.ed25519"
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(missing))
    no_key = refused("signing key")
    assert str(missing) in no_key and "RATCHET_AUDIT_KEY" in no_key and "never made" in no_key
    assert not missing.exists()                                        # no key was made for the log
    other = tmp_path / "other-key" / "audit-key.ed25519"
    load_or_create_key(other)
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(other))
    refused("is not the key that signed")
    monkeypatch.delenv("RATCHET_AUDIT_KEY")

    weights = tmp_path / "model" / "model.safetensors"
    kept = weights.read_bytes()
    weights.write_bytes(b"other weights")
    changed = refused("parity checkpoint")
    assert "holds other weights" in changed and "experiments/models/gemma4-tiny/train.py" in changed   # its recipe
    weights.write_bytes(kept)
    (tmp_path / "held.jsonl").rename(tmp_path / "held.moved")
    assert f"parity.prompts: {tmp_path / 'held.jsonl'}" in refused("reads files this host does not have")
    (tmp_path / "held.moved").rename(tmp_path / "held.jsonl")
    assert main(["resume", str(log_dir), "--wall-seconds", "0"]) == 2   # a budget must be above 0
    assert (log_dir / "log.jsonl").read_text() == text

    end = resume(log_dir)                                              # the same log, on its own host, goes on
    assert end.verdict.status == "improved" and not _payloads(log_dir, "campaign.host")
    assert verify(log_dir).ok and (home / ".config" / "ratchet" / "audit-key.ed25519").is_file()


def test_a_wall_budget_end_starts_no_round_it_cannot_finish_and_a_resume_with_a_new_budget_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _home(tmp_path / "home", monkeypatch)
    spec = write_target(tmp_path)
    spec.write_text(spec.read_text().replace("wall_seconds: 3600", "wall_seconds: 0.05"))
    first = start(spec, tmp_path / "logs", tmp_path / "ws")
    assert first.stop_reason.startswith("wall-time budget: 0 s left, a round takes")    # why, recorded
    assert first.verdict.status == "no-change" and not _payloads(first.log_dir, "iteration.hypothesis")
    (ended,) = _payloads(first.log_dir, "campaign.end")
    assert ended["ended_by"] == "wall_seconds" and ended["stop_reason"] == first.stop_reason

    assert main(["resume", str(first.log_dir)]) == 2                 # continuing it needs a new budget
    assert "--wall-seconds S" in " ".join(capsys.readouterr().err.split())
    # continued with a new budget, killed in it, and resumed again: the new budget holds on
    assert killed_at("propose:2", ["resume", str(first.log_dir), "--wall-seconds", "3600"]) == -9
    end = resume(first.log_dir)
    uninterrupted = start(write_target(tmp_path / "uninterrupted"), tmp_path / "u-logs", tmp_path / "u-ws")
    assert end.verdict.status == uninterrupted.verdict.status == "improved"
    assert _accepted(first.log_dir) == _accepted(uninterrupted.log_dir)
    continued, again = _payloads(first.log_dir, "campaign.resume")
    spent = ended["spent"].get("wall_seconds", 0.0)
    assert continued["continued"] and continued["wall_seconds_limit"] == pytest.approx(spent + 3600)
    assert "continued" not in again and read_journal(first.log_dir).wall_limit == continued["wall_seconds_limit"]
    assert [p["verdict"]["status"] for p in _payloads(first.log_dir, "campaign.end")] == ["no-change", "improved"]
    assert verify(first.log_dir).ok and read_journal(first.log_dir).ended
    with pytest.raises(CampaignError, match="is finished"):            # an end not on the wall budget is final
        resume(first.log_dir, wall_seconds=60)


# -- the pieces ----------------------------------------------------------------------------------------------------

def _journal(ws_root: Path, source: Path) -> Journal:
    """A campaign's journal as the log holds it: a workspace of `source` with one accepted commit."""
    from sandbox.workspace import Workspace

    ws = Workspace.create(ws_root, serving={"max_num_seqs": 1}, source=source)
    base, base_object = ws.head(), ws.commit_object()
    ws.repo.git.checkout("-q", "-b", "ratchet/c-1")
    diff = ws.apply_patch("diff --git a/vllm/a.py b/vllm/a.py\n--- a/vllm/a.py\n+++ b/vllm/a.py\n"
                          "@@ -1 +1 @@\n-A = 1\n+A = 2\n")
    commit = ws.commit("ratchet: a faster A\n\nRatchet-Iteration: 1")
    return Journal(campaign="c-1", spec_path=Path("/s.yaml"), spec={}, workspace=ws_root, branch="ratchet/c-1",
                   proposer="search", base_commit=base, incumbent_ref=commit,
                   start={"base_tree": ws.tree_hash(base), "base_commit_object": base_object},
                   branch_commits=[Committed("iteration 1", diff, commit, ws.commit_object(commit))])


def _source(tmp_path: Path, value: int = 1) -> Path:
    src = tmp_path / f"src-{value}" / "vllm"
    src.mkdir(parents=True)
    (src / "a.py").write_text("A = 1\n")
    (src / "b.py").write_text(f"B = {value}\n")
    return src


def test_a_rebuilt_workspace_holds_the_recorded_commits_and_a_log_or_source_that_cannot_rebuild_it_is_named(
        tmp_path: Path) -> None:
    journal = _journal(tmp_path / "ws-a", _source(tmp_path))
    ws, done = open_or_rebuild(journal, tmp_path / "ws-b", package="vllm", serving={"max_num_seqs": 1},
                               source=lambda: _source(tmp_path / "b"))
    assert done == {"path": str(tmp_path / "ws-b"), "rebuilt": True, "commits": [journal.incumbent_ref]}
    assert ws.head() == journal.incumbent_ref and ws.repo.active_branch.name == "ratchet/c-1"
    assert ws.resolve("main") == journal.base_commit and ws.is_clean()
    assert open_or_rebuild(journal, tmp_path / "ws-b", package="vllm", serving={}, source=lambda: None)[1] == {
        "path": str(tmp_path / "ws-b"), "rebuilt": False}

    with pytest.raises(CampaignError, match="not the tree the campaign began with"):
        open_or_rebuild(journal, tmp_path / "ws-c", package="vllm", serving={"max_num_seqs": 1},
                        source=lambda: _source(tmp_path / "c", value=2))
    assert not (tmp_path / "ws-c").exists() and not list(tmp_path.glob(".ws-c*"))   # nothing half made
    old = dataclasses.replace(journal, branch_commits=[dataclasses.replace(journal.branch_commits[0], raw=None)])
    with pytest.raises(CampaignError, match="does not record the raw commit of iteration 1"):
        open_or_rebuild(old, tmp_path / "ws-d", package="vllm", serving={}, source=lambda: None)
    (tmp_path / "ws-e").mkdir()
    (tmp_path / "ws-e" / "notes.txt").write_text("mine")
    with pytest.raises(CampaignError, match="holds something else"):
        open_or_rebuild(journal, tmp_path / "ws-e", package="vllm", serving={}, source=lambda: None)


def test_a_log_from_before_the_host_was_recorded_compares_what_its_environment_holds() -> None:
    env = {"vllm": "0.26.0", "torch": "2.11.0+cu130", "python": "3.12.3", "cpu": "x", "cpus": 16,
           "gpu": "NVIDIA H200, 580.65.06\nNVIDIA H200, 580.65.06"}
    old = host_of_start({"environment": env})
    assert (old.accelerator, old.accelerators, old.software["gpu_driver"]) == ("NVIDIA H200", 2, "580.65.06")
    here = Host(name="h", machine_id="m", accelerator="NVIDIA H200", accelerators=8,
                software={"vllm": "0.26.0", "torch": "2.11.0+cu130", "python": "3.12.3", "transformers": "5.5.3",
                          "triton": "3.5.0", "gpu_driver": "580.65.06"})
    assert differences(old, here) == []            # transformers and triton were not recorded: not compared
    h100 = dataclasses.replace(here, accelerator="NVIDIA H100 80GB HBM3")
    assert differences(old, h100) == ["accelerator: NVIDIA H200 recorded, NVIDIA H100 80GB HBM3 here"]
    cpu = host_of_start({"environment": {**env, "gpu": None}})
    assert cpu.accelerator == "cpu: x" and cpu.accelerators == 16


def test_a_host_record_reads_back_as_the_host_it_was_made_from() -> None:
    host = probe_host()
    assert Host.from_record(json.loads(json.dumps(host.record()))) == host
    assert host.accelerator and set(host.software) >= {"python", "torch", "vllm"}
