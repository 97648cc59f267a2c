"""Runs pristine `vllm bench serve` jobs in one process (importing vLLM costs ~8 s per process).

Invoked by harness.bench as `python -I -m harness.bench_driver JOBS.json` from the installed,
unpatched vLLM: `-I` ignores PYTHONPATH, so the candidate's tree can never supply the client.
Each job is the argv of `vllm bench serve`; results go where each argv's --result-dir says.
Before each job it prints RATCHET_JOB_READY and waits for a line on stdin: the harness first freezes
every server but the one this job measures (`go N`), or passes over a job whose build has failed (`skip N`).
A job that raises (its server died, say) is reported as RATCHET_JOB_FAILED and the next one goes on.

Each tokenizer is loaded once per process, not once per job: the client's own `get_tokenizer` is called the
first time and its object handed to later jobs that name the same tokenizer, as one vLLM server serves every
request with one tokenizer. Gemma 4's 262k-token tokenizer took 1.3-1.6 s a load on a 2-core host, between
one job's go and its first request; a job list of 64 runs loaded it 64 times.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any


def reuse_tokenizers(serve: ModuleType) -> dict[str, Any]:
    """Make `serve.get_tokenizer` load each (name, options) once; returns the cache, keyed by both."""
    load: Callable[..., Any] = serve.get_tokenizer
    loaded: dict[str, Any] = {}

    def get_tokenizer(name: object, *args: object, **kwargs: object) -> Any:
        key = json.dumps([str(name), [repr(a) for a in args], sorted((k, repr(v)) for k, v in kwargs.items())])
        if key not in loaded:
            loaded[key] = load(name, *args, **kwargs)
        return loaded[key]

    serve.get_tokenizer = get_tokenizer
    return loaded


def main(jobs_path: str) -> int:
    import vllm.benchmarks.serve as serve
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    reuse_tokenizers(serve)

    with open(jobs_path) as f:
        jobs = json.load(f)
    for index, argv in enumerate(jobs):
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(argv)
        print(f"RATCHET_JOB_READY {index}", flush=True)
        answer = sys.stdin.readline().strip()
        if answer == f"skip {index}":       # its build already failed a check: its later runs are not measured
            print(f"RATCHET_JOB_SKIPPED {index}", flush=True)
            continue
        if answer != f"go {index}":
            print(f"RATCHET_JOB_ABORT {index}", flush=True)
            return 1
        print(f"RATCHET_JOB_START {index}", flush=True)
        try:
            bench_main(args)
        except Exception:   # one build's dead server must not end the other builds' runs: the harness decides
            traceback.print_exc()
            print(f"RATCHET_JOB_FAILED {index}", flush=True)
            continue
        print(f"RATCHET_JOB_DONE {index}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
