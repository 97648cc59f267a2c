"""The kernel spec is strict, the tunables search writes patches the kernel policy lets through, and the policy
stops patches that leave the kernel folder or touch timers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.base import CampaignState, GiveUp, HistoryEntry, Proposal
from agent.kernel_spec import is_kernel_spec, load_kernel_spec
from agent.proposers.kernel_search import KernelSearchProposer, file_diff, read_tunables, write_tunables
from agent.spec import SearchConfig, SpecError
from policies import Ledger, decide, load_policy, parse_action
from tests.conftest import ROOT

GPU_SPEC = ROOT / "experiments" / "gemma4-e2b-attention-kernel.yaml"
CPU_SPEC = ROOT / "experiments" / "gemma4-attention-kernel-cpu.yaml"
KERNEL = ROOT / "experiments" / "kernels" / "gemma4_attention" / "attention.py"
POLICY = load_policy(ROOT / "policies" / "kernel.yaml")


def test_the_shipped_kernel_specs_validate() -> None:
    gpu = load_kernel_spec(GPU_SPEC)
    assert gpu.target.kernel_file == "gemma4_attention/attention.py" and gpu.target.source.is_dir()
    assert {s.head_dim for s in gpu.shapes} == {256, 512} and {s.sliding_window for s in gpu.shapes} == {512, None}
    assert all(s.num_q_heads == 8 and s.num_kv_heads == 1 for s in gpu.shapes)
    assert set(gpu.proposer.search.space) <= set(read_tunables(KERNEL.read_text()))
    assert load_kernel_spec(CPU_SPEC).interpret and is_kernel_spec(CPU_SPEC)
    assert not is_kernel_spec(ROOT / "experiments" / "gemma4-tiny-cpu.yaml")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(GPU_SPEC.read_text() + text)
    return path


@pytest.mark.parametrize(("extra", "message"), [
    ("timing_typo: 3\n", "timing_typo: unknown key"),
    ("interpret: true\n", "set device: cpu"),
    ("runner_timeout_s: 0\n", "runner_timeout_s"),
])
def test_bad_specs_are_rejected_with_the_field(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load_kernel_spec(_write(tmp_path, extra))


def test_unknown_shape_keys_and_non_integer_tunables_are_rejected(tmp_path: Path) -> None:
    text = GPU_SPEC.read_text().replace("head_dim: 256, sliding_window: 512}", "head_dim: 256, window: 512}", 1)
    (tmp_path / "a.yaml").write_text(text)
    with pytest.raises(SpecError, match=r"shapes\.0\.window: unknown key"):
        load_kernel_spec(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(GPU_SPEC.read_text().replace("DECODE_D256_SPLITS: [1, 2, 4, 8, 16]",
                                                                   "DECODE_D256_SPLITS: [1, 2.5]"))
    with pytest.raises(SpecError, match="list of integers"):
        load_kernel_spec(tmp_path / "b.yaml")


def test_a_serving_spec_is_not_a_kernel_spec() -> None:
    with pytest.raises(SpecError, match="not a kernel spec"):
        load_kernel_spec(ROOT / "experiments" / "gemma4-tiny-cpu.yaml")


class _Tools:
    def read_file(self, path: str) -> str:
        assert path == "gemma4_attention/attention.py"
        return KERNEL.read_text()


def _state(history: tuple[HistoryEntry, ...] = ()) -> CampaignState:
    base = read_tunables(KERNEL.read_text())
    return CampaignState(iteration=len(history) + 1, incumbent_ref="x", serving_config=base, incumbent_metrics=(),
                         baseline_metrics=(), history=history, baseline_serving_config=base)


def _decide(diff: str) -> str:
    return decide(POLICY, parse_action({"kind": "patch", "diff": diff}), Ledger()).verdict


def test_the_search_proposes_each_point_once_as_an_allowed_patch() -> None:
    proposer = KernelSearchProposer(SearchConfig(space={"DECODE_D512_SPLITS": [1, 2, 4]}),
                                    kernel_file="gemma4_attention/attention.py")
    history: tuple[HistoryEntry, ...] = ()
    seen = []
    for _ in range(3):
        got = proposer.propose(_state(history), _Tools(), rng=random.Random(0))   # type: ignore[arg-type]
        if isinstance(got, GiveUp):
            break
        assert isinstance(got, Proposal) and _decide(got.patch) == "allow"
        added = [line for line in got.patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
        assert len(added) == 1 and added[0].startswith("+DECODE_D512_SPLITS = ")      # one line changes
        seen.append(got.source)
        history += (HistoryEntry(iteration=len(history) + 1, hypothesis="", outcome="rejected", source=got.source),)
    assert len(seen) == 2 and len(set(seen)) == 2          # 2 and 4; 1 is the baseline
    assert isinstance(proposer.propose(_state(history), _Tools(), rng=random.Random(0)), GiveUp)  # type: ignore[arg-type]


def test_the_kernel_policy_denies_patches_outside_the_folder_or_touching_timers() -> None:
    text = KERNEL.read_text()
    assert _decide(file_diff("gemma4_attention/attention.py", text, write_tunables(text, {"DECODE_D512_SPLITS": 8}))) \
        == "allow"
    timer = text.replace("import torch\n", "import torch\nimport time\n", 1)
    assert _decide(file_diff("gemma4_attention/attention.py", text, timer)) == "deny"
    event = text + "\n_T = torch.cuda.Event(enable_timing=True)\n"
    assert _decide(file_diff("gemma4_attention/attention.py", text, event)) == "deny"
    assert _decide(file_diff("harness/kernel/timing.py", "a\n", "b\n")) == "deny"
    assert _decide(file_diff("gemma4_attention/__init__.py", "", "x = 1\n")) == "deny"


def test_the_kernel_policy_denies_attribute_surgery_however_the_target_is_spelled() -> None:
    """`setattr` on torch.cuda.Event passed when the class was reached through strings or an alias."""
    text = KERNEL.read_text()
    spellings = [
        "\n_E = getattr(getattr(torch, 'cu' + 'da'), 'Ev' + 'ent')\nsetattr(_E, 'elapsed_time', lambda s, e: 1.0)\n",
        "\n_c = torch\nsetattr(_c, 'x', 1)\n",
        "\nvars(torch)['cuda'] = None\n",
        "\ntype(torch.empty(1)).__dict__\n",
        "\nclass _Fast:\n    pass\n_t = torch.empty(1)\n_t.__class__ = _Fast\n",
    ]
    for extra in spellings:
        assert _decide(file_diff("gemma4_attention/attention.py", text, text + extra)) == "deny", extra


def test_the_vllm_kernel_spec_searches_exactly_what_its_prelude_names() -> None:
    spec = load_kernel_spec(ROOT / "experiments" / "vllm-unified-attention-e2b.yaml")
    assert spec.target.interface == "vllm-unified-attention" and spec.target.source is None   # the installed vLLM
    assert spec.target.kernel_file == "vllm/v1/attention/ops/triton_unified_attention.py"
    assert spec.policy_file.name == "vllm-kernel.yaml" and spec.timing.cuda_graph == "decode"
    assert spec.target.prelude is not None
    added = "\n".join(line[1:] for line in spec.target.prelude.read_text().splitlines() if line.startswith("+"))
    named = read_tunables(added)
    assert set(spec.proposer.search.space) == set(named) and set(named.values()) == {0}   # 0: vLLM's own choice
    assert all(0 in values for values in spec.proposer.search.space.values())
    assert {(s.head_dim, s.sliding_window) for s in spec.shapes} == {(256, 512), (512, None)}


def test_a_contiguous_kernel_spec_needs_its_source_and_vllms_needs_the_vllm_folder(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(GPU_SPEC.read_text().replace("  source: kernels/gemma4_attention\n", ""))
    with pytest.raises(SpecError, match="source"):
        load_kernel_spec(path)
    vllm_interface = "  kind: kernel\n  interface: vllm-unified-attention\n"
    path.write_text(GPU_SPEC.read_text().replace("  kind: kernel\n", vllm_interface))
    with pytest.raises(SpecError, match="vllm package folder"):
        load_kernel_spec(path)
