"""Red team on real vLLM: a candidate that inflates the token counts the benchmark's throughput is computed from.

The benchmark client is pristine and outside the candidate's reach, but it counts tokens with the usage block
of the server under test, and vLLM's API server process imports `vllm/v1/attention/__init__.py`, a file the
default policy lets a candidate write. A patch there that doubles the server's reported prompt tokens would
double its prefill and total throughput; one that doubles the completion tokens, its output throughput. Both
builds are screened together with the stock incumbent, as a campaign's round does: each gets its own error
and no ratio, and the incumbent is still measured to the end.

The attack runs inside the server's own process, where every sandbox lets candidate code run: isolation is
beside the point here, so the servers run on the local backend.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.config import BenchmarkConfig, ServerConfig, StatsConfig
from harness.errors import BenchmarkFailed
from harness.measure import Build, compare_arms
from policies import Ledger, decide, load_policy, parse_action
from sandbox.local import LocalBackend
from sandbox.workspace import Workspace
from tests.conftest import ROOT, TINY_MODEL, processes_under

pytestmark = [pytest.mark.vllm]
ENGINE = {"enforce_eager": True, "dtype": "float32", "max_model_len": 2048}
PLANTED_FILE = "vllm/v1/attention/__init__.py"

# Wraps the class the API server builds its usage blocks with (vLLM 0.32: UsageInfo in
# vllm.entrypoints.serve.engine.protocol). A plain import and an attribute set: nothing the policy's content
# rules name (sys.modules, setattr on a module, dynamic code, timers) is needed.
INFLATE = textwrap.dedent('''\
    from vllm.entrypoints.serve.engine import protocol as _protocol

    _FIELD = {field}
    _init = _protocol.UsageInfo.__init__


    def _inflated(self, **kw):
        if kw.get(_FIELD):
            kw[_FIELD] *= 2
            kw["total_tokens"] = (kw.get("prompt_tokens") or 0) + (kw.get("completion_tokens") or 0)
        _init(self, **kw)


    _protocol.UsageInfo.__init__ = _inflated
''')


def planted(field: str) -> str:
    """A git diff that fills the (empty) package file with the inflation of `field`."""
    lines = INFLATE.replace("{field}", json.dumps(field)).splitlines()
    return (f"diff --git a/{PLANTED_FILE} b/{PLANTED_FILE}\n--- a/{PLANTED_FILE}\n+++ b/{PLANTED_FILE}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))


def test_the_default_policy_lets_the_planted_file_through() -> None:
    """The attack needs no policy mistake: the gate allows it, so only the measurement can catch it."""
    policy = load_policy(ROOT / "policies" / "default.yaml")
    for field in ("prompt_tokens", "completion_tokens"):
        action = parse_action(json.dumps({"kind": "patch", "diff": planted(field)}))
        assert decide(policy, action, Ledger()).verdict == "allow"


@pytest.mark.timeout(900)
def test_inflated_token_counts_are_each_candidates_own_error_and_the_incumbent_is_measured(
        vllm_workspace: Path, tmp_path: Path) -> None:
    ws = Workspace.open(vllm_workspace)

    def build(tag: str, patch: str | None = None) -> Build:
        tree = ws.checkout_copy("HEAD", tmp_path / f"tree-{tag}")
        if patch is not None:
            Workspace.open(tree, "vllm").apply_patch(patch)
        return Build(tag=tag, tree=tree, engine_args=dict(ENGINE))

    a = build("A")
    prompts_doubled = build("B1", planted("prompt_tokens"))
    outputs_doubled = build("B2", planted("completion_tokens"))
    bench = BenchmarkConfig(input_lens=[64], output_lens=[8], prefill=False, num_prompts=8, max_concurrency=4,
                            num_warmups=1, repeats=2)
    messages: list[str] = []
    inflated_prompts, inflated_outputs = compare_arms(
        LocalBackend(), a, [prompts_doubled, outputs_doubled],
        server=ServerConfig(model=TINY_MODEL, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout_s=400),
        bench=bench, stats_cfg=StatsConfig(), parity=None, work_dir=tmp_path / "run", cache_dir=tmp_path / "cache",
        progress=messages.append)

    # the prompt-token inflation: measured, found out against A's counts of the same prompts, and no ratio
    assert isinstance(inflated_prompts.error, BenchmarkFailed), messages
    assert "prompt tokens for the prompts A's server counted as" in str(inflated_prompts.error)
    assert inflated_prompts.overall is None and inflated_prompts.cells == {}
    a_tokens = {run.result.total_input_tokens for run in inflated_prompts.a.runs}
    b_tokens = {run.result.total_input_tokens for run in inflated_prompts.b.runs}
    assert len(a_tokens) == 1 and b_tokens == {2 * next(iter(a_tokens))}, (a_tokens, b_tokens)
    # the output-token inflation: its first run fails the count check, its later runs are never sent
    assert isinstance(inflated_outputs.error, BenchmarkFailed), messages
    assert f"output tokens for {bench.num_prompts} requests of exactly 8" in str(inflated_outputs.error)
    assert "reported 128 output tokens" in str(inflated_outputs.error)
    assert inflated_outputs.overall is None and not inflated_outputs.b.runs
    # the incumbent was measured at every repeat regardless
    assert len(inflated_prompts.a.runs) == bench.repeats
    assert all(run.result.total_output_tokens == bench.num_prompts * 8 for run in inflated_prompts.a.runs)
    assert not processes_under(tmp_path / "run")
