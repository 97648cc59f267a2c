"""Runs pristine `vllm bench serve` jobs in one process (importing vLLM costs ~8 s per process).

Invoked by harness.bench as `python -I -m harness.bench_driver JOBS.json` from the installed,
unpatched vLLM: `-I` ignores PYTHONPATH, so the candidate's tree can never supply the client.
Each job is the argv of `vllm bench serve`; results go where each argv's --result-dir says.
Before each job it prints RATCHET_JOB_READY and waits for a line on stdin: the harness first freezes
every server but the one this job measures.
"""

from __future__ import annotations

import json
import sys


def main(jobs_path: str) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    with open(jobs_path) as f:
        jobs = json.load(f)
    for index, argv in enumerate(jobs):
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(argv)
        print(f"RATCHET_JOB_READY {index}", flush=True)
        if sys.stdin.readline().strip() != f"go {index}":
            print(f"RATCHET_JOB_ABORT {index}", flush=True)
            return 1
        print(f"RATCHET_JOB_START {index}", flush=True)
        bench_main(args)
        print(f"RATCHET_JOB_DONE {index}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
