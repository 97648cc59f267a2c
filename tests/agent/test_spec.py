from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = """
schema_version: 1
name: t
server: {model: m}
benchmark: {input_lens: [8], output_lens: [4]}
parity: {prompts: p.jsonl}
"""


@pytest.mark.parametrize("name", ["gemma4-tiny-cpu.yaml", "gemma4-e2b-gpu.yaml", "gemma4-e2b-gpu-docker.yaml",
                                  "gemma4-tiny-mm-cpu.yaml", "gemma4-e2b-gpu-mm.yaml"])
def test_bundled_specs_validate(name: str) -> None:
    spec = load_spec(ROOT / "experiments" / name)
    assert spec.server.model.is_absolute() and spec.parity.prompts.is_absolute()


def test_the_docker_gpu_spec_is_the_e2b_config_served_by_the_vllm_image_it_copies() -> None:
    docker = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu-docker.yaml")
    plain = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    assert docker.target.kind == "vllm-image" and docker.target.package == "vllm"
    assert (docker.sandbox.backend, docker.sandbox.image, docker.sandbox.gpus) == \
        ("docker", "vllm/vllm-openai:v0.26.0", 1)
    assert docker.hardware == "gpu"
    for section in ("server", "benchmark", "parity", "stats", "budget", "proposer"):
        assert getattr(docker, section) == getattr(plain, section), section


def test_a_vllm_image_target_needs_the_docker_backend_and_no_source(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL + "target: {kind: vllm-image}\n")
    with pytest.raises(SpecError, match=r"vllm-image copies vLLM out of sandbox.image .* set sandbox.backend: docker"):
        load_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(MINIMAL + "target: {kind: vllm-image, source: src}\nsandbox: {backend: docker}\n")
    with pytest.raises(SpecError, match="target.source is for target.kind: vllm-source"):
        load_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(MINIMAL + "target: {kind: vllm-image}\nsandbox: {backend: docker, image: img}\n")
    spec = load_spec(tmp_path / "s.yaml")
    with pytest.raises(SpecError, match="no folder on this host"):
        spec.target_source()


def test_the_seed_grid_is_in_the_gpu_spec() -> None:
    spec = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml")
    labels = {c.label for c in spec.benchmark.cells()}
    assert {"in512/out128", "in2048/out256", "in8192/out128", "in8192/out1"} <= labels


def test_relative_paths_are_relative_to_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL)
    spec = load_spec(tmp_path / "s.yaml")
    assert spec.server.model == tmp_path / "m" and spec.parity.prompts == tmp_path / "p.jsonl"


def test_an_unknown_key_is_named_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL.replace("input_lens", "input_lenz"))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "s.yaml")
    assert "benchmark.input_lenz: unknown key" in str(err.value)
    assert "benchmark.input_lens: Field required" in str(err.value)


def test_a_bad_value_is_named_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL.replace("[8]", "[8, -1]"))
    with pytest.raises(SpecError, match=r"benchmark\.input_lens\.1: Input should be greater than 0"):
        load_spec(tmp_path / "s.yaml")


def test_missing_and_non_yaml_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(tmp_path / "list.yaml")


def test_the_guard_may_not_exceed_the_threshold(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL + "stats: {accept_lower_bound: 1.0, cell_guard: 1.0}\n"
                                     .replace("1.0, cell_guard: 1.0", "0.9, cell_guard: 0.95"))
    with pytest.raises(SpecError, match="cell_guard"):
        load_spec(tmp_path / "s.yaml")


def test_the_executor_defaults_to_local_and_local_slots_are_bounded_by_one_host(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL)
    assert (load_spec(tmp_path / "s.yaml").executor.kind, load_spec(tmp_path / "s.yaml").executor.slots) == ("local", 1)
    ray_spec = load_spec(ROOT / "experiments" / "gemma4-tiny-cpu-ray.yaml")
    assert (ray_spec.executor.kind, ray_spec.executor.slots, ray_spec.executor.ray.max_retries) == ("ray", 2, 1)
    (tmp_path / "s.yaml").write_text(MINIMAL + "executor: {slots: 3}\n")
    assert load_spec(tmp_path / "s.yaml").executor.slots == 3     # screened together against one incumbent
    (tmp_path / "s.yaml").write_text(MINIMAL + "executor: {slots: 7}\n")
    with pytest.raises(SpecError, match="at most 6"):
        load_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(MINIMAL + "executor: {kind: ray, ray: {gpus: 1}}\n")
    with pytest.raises(SpecError, match="executor.ray.gpus: unknown key"):
        load_spec(tmp_path / "s.yaml")


def test_a_gpu_spec_that_starts_servers_together_fixes_the_kv_cache(tmp_path: Path) -> None:
    gpu = MINIMAL + "hardware: gpu\n"
    (tmp_path / "s.yaml").write_text(gpu)
    with pytest.raises(SpecError, match="kv_cache_memory_bytes"):
        load_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(gpu.replace("server: {model: m}", "server: {model: m, start_together: false}"))
    assert not load_spec(tmp_path / "s.yaml").server.start_together
    (tmp_path / "s.yaml").write_text(gpu.replace(
        "server: {model: m}", "server: {model: m, engine_args: {kv_cache_memory_bytes: 1073741824}}"))
    assert load_spec(tmp_path / "s.yaml").server.start_together     # the default
    (tmp_path / "s.yaml").write_text(MINIMAL)
    assert load_spec(tmp_path / "s.yaml").server.start_together     # a CPU KV cache is sized from the config


def test_dummy_speed_weights_need_a_real_parity_checkpoint(tmp_path: Path) -> None:
    dummy = MINIMAL.replace("server: {model: m}", "server: {model: m, engine_args: {load_format: dummy}}")
    (tmp_path / "s.yaml").write_text(dummy)
    with pytest.raises(SpecError, match="set parity.model"):
        load_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(dummy.replace(
        "parity: {prompts: p.jsonl}", "parity: {prompts: p.jsonl, model: real, engine_args: {load_format: auto}}"))
    spec = load_spec(tmp_path / "s.yaml")
    assert spec.parity.model == tmp_path / "real" and spec.parity.engine_args == {"load_format": "auto"}


@pytest.mark.parametrize(("parity", "error"), [
    ("{prompts: p.jsonl, engine_args: {load_format: auto}}", "only applies to a parity.model server"),
    # a candidate may tune max_num_seqs: a parity override of it would hide the candidate's change
    ("{prompts: p.jsonl, model: r, engine_args: {max_num_seqs: 1}}",
     "may only set kv_cache_memory_bytes, load_format, max_model_len"),
    ("{prompts: p.jsonl, model: r, engine_args: {load_format: safetensors}}",
     "load_format='safetensors': expected one of auto, dummy"),
])
def test_parity_overrides_are_limited_to_what_the_checkpoint_needs(tmp_path: Path, parity: str, error: str) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL.replace("parity: {prompts: p.jsonl}", f"parity: {parity}"))
    with pytest.raises(SpecError, match=error):
        load_spec(tmp_path / "s.yaml")


def test_server_engine_args_are_checked_when_the_spec_loads(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL.replace("server: {model: m}",
                                                     "server: {model: m, engine_args: {port: 1}}"))
    with pytest.raises(SpecError, match="fixed by the harness"):
        load_spec(tmp_path / "s.yaml")


@pytest.mark.parametrize(("space", "message"), [
    ("{cuda_graph_mode: [FULL]}", "proposer.search.space.cuda_graph_mode: engine arg 'cuda_graph_mode' is not allowed"),
    ("{cudagraph_mode: [full]}", "proposer.search.space.cudagraph_mode: engine arg cudagraph_mode='full': expected"),
    ("{max_num_seqs: [8, true]}", "proposer.search.space.max_num_seqs: engine arg max_num_seqs=True: expected int"),
])
def test_the_search_space_is_checked_when_the_spec_loads(tmp_path: Path, space: str, message: str) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL + f"proposer: {{kind: search, search: {{space: {space}}}}}\n")
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(tmp_path / "s.yaml")


def test_the_gpu_spec_searches_the_scheduler_and_cuda_graph_knobs() -> None:
    space = load_spec(ROOT / "experiments" / "gemma4-e2b-gpu.yaml").proposer.search.space
    assert {"max_num_batched_tokens", "long_prefill_token_threshold", "cudagraph_mode", "max_cudagraph_capture_size",
            "async_scheduling"} <= set(space)
    assert "FULL_AND_PIECEWISE" not in space["cudagraph_mode"]     # vLLM 0.26's mode on the H200: not a move


@pytest.mark.parametrize(("llm", "message"), [
    ("{max_turn: 3}", "proposer.llm.max_turn: unknown key"),
    ("{temperature: 5}", "proposer.llm.temperature: Input should be less than or equal to 2"),
    ("{tool_choice: always}", "proposer.llm.tool_choice"),
])
def test_llm_settings_are_checked_when_the_spec_loads(tmp_path: Path, llm: str, message: str) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL + f"proposer: {{kind: llm, llm: {llm}}}\n")
    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(tmp_path / "s.yaml")


def test_llm_settings_may_leave_the_model_to_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(MINIMAL + "proposer: {kind: llm, llm: {max_turns: 3, base_url: http://127.0.0.1:9/v1}}\n")
    assert load_spec(tmp_path / "s.yaml").proposer.llm.model is None


def test_a_kernel_spec_given_to_a_serving_command_names_the_command_that_takes_it() -> None:
    with pytest.raises(SpecError, match=r"a kernel spec .*ratchet kernel SPEC"):
        load_spec(ROOT / "experiments" / "gemma4-attention-kernel-cpu.yaml")
