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

Every measured request's streamed token ids and top-k logprobs are kept (`capture_streams`) when the job asks
for logprobs: the client itself reads only the text. The driver wraps the completions request function to keep
each request's raw messages (a list append per chunk, nothing parsed while the clock runs), parses them after the
run and writes them beside the result (`tokens_path`), in request order. harness/workload.py compares them
between the two builds position by position: the parity check is the measured traffic itself, so there is no
moment of a measurement a candidate could tell apart from a check.
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import traceback
from collections.abc import Callable, MutableMapping
from types import ModuleType
from typing import Any

# The raw SSE messages of the request whose task is running (None outside a captured request).
_STREAM: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("ratchet_stream", default=None)
TOKENS_SUFFIX = ".tokens.json"
CAPTURED_BACKENDS = ("vllm", "openai")     # the completions endpoint: its logprobs carry token ids
# Printed when a run's first measured request is sent: the harness's clock for the duration check starts there, so a
# cold server's warm-ups (20 s on a 2-core host, not in the client's duration) do not count against the run.
MEASURED_LINE = "RATCHET_RUN_MEASURED"


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


class StreamCapture:
    """One job's measured requests: each identified request's raw stream messages, by request id, and whether the
    first of them has been sent (the measured run began: MEASURED_LINE, for the harness's clock)."""

    def __init__(self) -> None:
        self.streams: dict[str, list[str]] = {}
        self.measured = False

    def reset(self) -> None:
        self.streams.clear()
        self.measured = False


def capture_streams(lib: ModuleType, request_funcs: MutableMapping[str, Any]) -> StreamCapture:
    """Wrap every request function: the first identified request of a run prints MEASURED_LINE (warm-ups and the
    client's first test request carry no id: they are not measured), and the completions endpoint's identified
    requests keep their raw stream messages."""
    capture = StreamCapture()
    add_chunk = lib.StreamedResponseHandler.add_chunk

    def recording_add_chunk(self: object, chunk_bytes: bytes) -> list[str]:
        messages: list[str] = add_chunk(self, chunk_bytes)
        box = _STREAM.get()
        if box is not None:
            box.extend(messages)
        return messages

    lib.StreamedResponseHandler.add_chunk = recording_add_chunk
    for name, original in list(request_funcs.items()):
        request_funcs[name] = _recording(original, capture, keep=name in CAPTURED_BACKENDS)
    return capture


def _recording(original: Any, capture: StreamCapture, *, keep: bool) -> Any:
    async def recording(request_func_input: Any, session: Any, pbar: Any = None) -> Any:
        request_id = request_func_input.request_id
        if not request_id:
            return await original(request_func_input, session, pbar)
        if not capture.measured:
            capture.measured = True
            print(MEASURED_LINE, flush=True)
        if not keep:
            return await original(request_func_input, session, pbar)
        box: list[str] = []
        token = _STREAM.set(box)
        try:
            return await original(request_func_input, session, pbar)
        finally:
            _STREAM.reset(token)
            capture.streams[request_id] = box

    return recording


def _token_id(key: str) -> int:
    """`return_tokens_as_token_ids` names each token `token_id:N`."""
    return int(key.rsplit(":", 1)[1])


def parse_stream(messages: list[str]) -> dict[str, list[Any]]:
    """One request's streamed completions messages -> its generated token ids, each one's logprob, and the
    top-k (id, logprob) pairs at each position, best first."""
    ids: list[int] = []
    chosen: list[float] = []
    top: list[list[list[float]]] = []
    for message in messages:
        body = message.removeprefix("data: ")
        if not body.startswith("{"):
            continue
        choices = json.loads(body).get("choices") or []
        logprobs = choices[0].get("logprobs") if choices else None
        if not logprobs:
            continue
        ids += [_token_id(t) for t in logprobs["tokens"]]
        chosen += [float(v) for v in logprobs["token_logprobs"]]
        for entry in logprobs["top_logprobs"]:
            ranked = sorted(((_token_id(k), float(v)) for k, v in (entry or {}).items()), key=lambda kv: -kv[1])
            top.append([[float(i), v] for i, v in ranked])
    return {"token_ids": ids, "logprobs": chosen, "top_logprobs": top}


def write_tokens(captured: dict[str, list[str]], prefix: str, path: str) -> None:
    """The captured requests of one run, in request order (the dataset numbers its requests `prefix` + index),
    written atomically: the harness reads the file only after the run's DONE line."""
    requests: dict[int, dict[str, list[Any]]] = {}
    for request_id, messages in captured.items():
        if request_id.startswith(prefix) and request_id[len(prefix):].isdigit():
            requests[int(request_id[len(prefix):])] = parse_stream(messages)
    ordered = [requests.get(index) for index in range(max(requests, default=-1) + 1)]
    with open(path + ".part", "w") as f:
        json.dump({"requests": ordered}, f, separators=(",", ":"))
    os.replace(path + ".part", path)


def main(jobs_path: str) -> int:
    import vllm.benchmarks.lib.endpoint_request_func as request_lib
    import vllm.benchmarks.serve as serve
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    reuse_tokenizers(serve)
    captured = capture_streams(request_lib, request_lib.ASYNC_REQUEST_FUNCS)

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
        captured.reset()
        try:
            bench_main(args)
            if args.logprobs is not None:
                write_tokens(captured.streams, args.request_id_prefix,
                             os.path.join(args.result_dir, args.result_filename + TOKENS_SUFFIX))
        except Exception:   # one build's dead server must not end the other builds' runs: the harness decides
            traceback.print_exc()
            print(f"RATCHET_JOB_FAILED {index}", flush=True)
            continue
        print(f"RATCHET_JOB_DONE {index}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
