"""The end-to-end stage of a campaign on vLLM's kernel (a kernel spec's `serving:`): when the kernel stage's final
comparison accepts its best, stock and best are served from the same vLLM tree and the campaign's verdict rests on
that A/B. The kernel stage runs the real kernel runner on the plain-torch stand-in of tests/kernel/vllm_fakes.py;
the serving A/B goes through the fake measurement seam (tests/fake_measurements.py: no vLLM), whose speed is read
off the served tree's kernel file here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import tests.fake_measurements as fake
from agent.kernel_campaign import start_kernel_campaign
from agent.kernel_spec import load_kernel_spec
from agent.measurements import HARNESS
from agent.proposers.kernel_search import file_diff
from agent.spec import SpecError
from audit import verify
from audit.reader import payload_of, read_records
from harness.measure import Build
from policies import load_policy, redecider
from tests.conftest import TINY_MODEL
from tests.fake_measurements import FakeMeasurements
from tests.kernel import vllm_fakes
from tests.kernel.vllm_fakes import KERNEL_FILE, write_vllm_tree

KERNEL_SPEC = vllm_fakes.CAMPAIGN_SPEC.replace("name: vllm-kernel-test", "name: vllm-kernel-serving-test") + (
    "serving: serving.yaml\n")

SERVING_SPEC = """
schema_version: 1
name: served
server: {{model: {model}, engine_args: {{max_num_seqs: 8, enforce_eager: true}}}}
benchmark: {{input_lens: [8], output_lens: [4], num_prompts: 8, max_concurrency: 4, repeats: 4}}
parity: {{prompts: {prompts}, max_tokens: 4}}
sandbox: {{backend: unisolated}}
"""


def _end_to_end_speed(kernel_gain: float) -> Any:
    """The fake's speed of a served build: `kernel_gain` when the tree's kernel runs one pass (the search's win)."""
    def speed_of(build: Build) -> float:
        text = (build.tree / KERNEL_FILE).read_text() if (build.tree / KERNEL_FILE).is_file() else ""
        return kernel_gain if re.search(r"^GEMMA4_PASSES = 1$", text, re.M) else 1.0
    return speed_of


class KernelRunnerAndFakeServing(FakeMeasurements):
    """The real kernel runner for the kernel stage; the fake seam for everything served."""

    def kernel(self, *args: Any, **kw: Any) -> dict[str, Any]:
        return HARNESS.kernel(*args, **kw)


def two_stage_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_gain: float, *,
                   serving_spec: str = SERVING_SPEC, kernel_spec: str = KERNEL_SPEC) -> Path:
    """The stand-in vLLM tree, its prelude, held prompts, the serving spec and the kernel spec (returned), the audit
    key under `tmp_path`, and the fake's end-to-end speed of the kernel stage's win."""
    monkeypatch.setenv("RATCHET_AUDIT_KEY", str(tmp_path / "keys" / "audit-key.ed25519"))
    monkeypatch.setattr(fake, "speed_of", _end_to_end_speed(kernel_gain))
    write_vllm_tree(tmp_path / "src")
    (tmp_path / "prelude.patch").write_text(file_diff(KERNEL_FILE, vllm_fakes.KERNEL, vllm_fakes.NAMED))
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"id": f"held-{i}", "prompt_token_ids": [5 + (i + j) % 200
                                                                               for j in range(8 + i)]}) + "\n"
                            for i in range(6)))
    (tmp_path / "serving.yaml").write_text(serving_spec.format(model=TINY_MODEL, prompts=held))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(kernel_spec)
    return spec_path


def _campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_gain: float, *,
              serving_spec: str = SERVING_SPEC, measure: FakeMeasurements | None = None) -> tuple[Any, Path]:
    spec_path = two_stage_spec(tmp_path, monkeypatch, kernel_gain, serving_spec=serving_spec)
    end = start_kernel_campaign(load_kernel_spec(spec_path), spec_path, log_root=tmp_path / "logs",
                                workspace_root=tmp_path / "ws", measure=measure or KernelRunnerAndFakeServing())
    return end, spec_path


def test_a_kernel_gain_that_holds_end_to_end_is_the_campaigns_verdict(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Parity here runs on a checkpoint of its own, as on the GPU specs (dummy weights for speed): stock's and best's
    parity servers are gated on ports of their own and handed to the A/B with the speed servers' ports, so that
    all four start together (on an H200 they had started one pair after the other: ~155 s more)."""
    measure = KernelRunnerAndFakeServing()
    own_checkpoint = SERVING_SPEC.replace(
        "parity: {{", "parity: {{model: {model}, engine_args: {{max_model_len: 512}}, ")
    end, spec_path = _campaign(tmp_path, monkeypatch, kernel_gain=1.4, measure=measure, serving_spec=own_checkpoint)
    assert end.final is not None and end.final["outcome"] == "accepted"
    assert end.serving is not None and end.serving["verdict"]["status"] == "improved", end.serving
    assert end.serving["parity_ok"] and end.serving["overall"]["low"] > 1.3
    assert end.serving["engine_args"] == {"max_num_seqs": 8, "enforce_eager": True}   # the same for both builds
    records = read_records(end.log_dir)
    kinds = [r["kind"] for r in records]
    assert kinds.index("final.result") < kinds.index("serving.result") < kinds.index("campaign.end")
    (ports,) = measure.ports
    assert ports is not None and set(ports) == {"A", "B", "A-parity", "B-parity"} and len(set(ports.values())) == 4
    served = [payload_of(end.log_dir, r)["action"] for r in records
              if r["kind"] == "action" and r.get("rule") == "allow-vllm-serve-local"]
    assert sorted(a["port"] for a in served) == sorted(ports.values())  # every server was gated
    assert sum(a["argv"][a["argv"].index("--max-model-len") + 1] == "512" for a in served
               if "--max-model-len" in a["argv"]) == 2                  # the parity servers with parity's args
    campaign_end = payload_of(end.log_dir, records[kinds.index("campaign.end")])
    assert campaign_end["serving_verdict"]["status"] == "improved"
    checked = verify(end.log_dir, redecide=redecider([load_policy(load_kernel_spec(spec_path).policy_file)]))
    assert checked.ok, checked


def test_a_kernel_gain_that_vanishes_end_to_end_is_not_shown(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    end, _ = _campaign(tmp_path, monkeypatch, kernel_gain=1.0)
    assert end.final is not None and end.final["outcome"] == "accepted"      # faster as a kernel...
    assert end.serving is not None and end.serving["verdict"]["status"] == "not-shown"   # ...not end to end
    assert "NOT" in end.serving["verdict"]["text"]


def test_the_serving_stage_needs_vllms_kernel_and_a_serving_spec_whose_parity_covers_its_grid(
        tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(KERNEL_SPEC.replace("interface: vllm-unified-attention, ", "").replace(
        "source: src/vllm", "source: src/kernel"))
    with pytest.raises(SpecError, match="serving"):
        load_kernel_spec(spec)
    write_vllm_tree(tmp_path / "src")
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"id": "held-0", "prompt_token_ids": [5, 6]}) + "\n")
    (tmp_path / "serving.yaml").write_text(SERVING_SPEC.format(model=TINY_MODEL, prompts=short))
    spec.write_text(KERNEL_SPEC)
    from agent.kernel_serving import load_serving_stage

    with pytest.raises(SpecError, match="parity"):
        load_serving_stage(load_kernel_spec(spec))
