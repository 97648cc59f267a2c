"""The embedded multimodal campaign's measurement path end to end: `ratchet compare` of the shipped multimodal
spec, real vLLM CPU servers of the trained tiny Gemma 4 with a vision tower, the pristine client sending
pictures through the chat endpoint, held parity prompts with pictures. The candidate is a planted bug of vLLM's
image path (the soft-token grid transposed): parity must break on the pictures and only there, and the
benchmark's own image requests must be answered wrongly by the candidate alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, processes_under

SPEC = ROOT / "experiments" / "gemma4-tiny-mm-cpu.yaml"
PLANTED = ROOT / "experiments" / "models" / "gemma4-tiny-mm" / "planted" / "soft-tokens-transposed.patch"


def _spec(tmp_path: Path) -> Path:
    """The shipped spec with absolute paths, the unisolated backend (this test is about the multimodal path;
    the isolation of servers is the docker and campaign tests' subject), fewer prompts per run."""
    data = yaml.safe_load(SPEC.read_text())
    base = SPEC.parent
    data["server"]["model"] = str(base / data["server"]["model"])
    data["parity"]["prompts"] = str(base / data["parity"]["prompts"])
    data["parity"]["visible_prompts"] = str(base / data["parity"]["visible_prompts"])
    data["policy"] = str((base / data["policy"]).resolve())
    data["benchmark"]["num_prompts"] = 8
    data["sandbox"] = {"backend": "unisolated"}
    path = tmp_path / "mm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.vllm
def test_a_bug_in_the_image_path_breaks_parity_on_pictures_and_the_image_cells_are_judged_apart(
        tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "compare", str(spec), "--candidate", str(PLANTED), "--workspace",
         str(tmp_path / "ws"), "--repeats", "4", "--cells", "in128/out32,in16/out32/img1x96",
         "--out", str(tmp_path / "c.json")], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 1, proc.stderr[-3000:]                # compare's "parity broken"
    out = json.loads((tmp_path / "c.json").read_text())
    parity = out["parity"]
    broken = {v["prompt_id"] for v in parity["verdicts"] if not v["match"]}
    assert not parity["ok"] and broken and all("-image-" in pid for pid in broken)    # text prompts identical
    held_images = [v for v in parity["verdicts"] if "-image-" in v["prompt_id"]]
    assert len(broken) >= len(held_images) // 2
    scores = parity["workload"]["scores"]
    assert scores["candidate_only"] >= 16 and scores["reference_only"] == 0 and not parity["workload"]["ok"]
    assert set(out["cells"]) == {"in128/out32", "in16/out32/img1x96"}
    assert out["overall"] is not None and out["images"] is not None and out["images"]["n"] == 4
    assert "image cells (geo-mean)" in proc.stdout and "text cells (geo-mean)" in proc.stdout
    image_sample = next(s for s in out["samples"]["A"] if s["cell"] == "in16/out32/img1x96")
    assert image_sample["image_tokens_per_request"] == 66         # <boi>, 64 soft tokens, <eoi>
    assert not processes_under(tmp_path / "ws.runs")
