"""Fakes that ship with the tests (no mocks): a scripted OpenAI-compatible HTTP server, an in-memory
`Tools`, and a scripted `Proposer`.

    with ScriptedOpenAIServer([reply(call("list_files", directory="vllm")), say("hi"),
                               HTTPError(429), Slow(5.0, reply(call("submit")))]) as server:
        proposer = LLMProposer(LLMConfig(base_url=server.base_url, model="scripted"))
        proposer.propose(state, FakeTools(...), rng=...)
        server.requests      # every request body the agent sent, parsed

    FakeTools(files={"vllm/x.py": "..."}, deny={"vllm/secret*": "why"}, budgets={"llm_tokens": 1000})
    FakeProposer([Proposal(...), GiveUp("..."), ProposerError("..."), lambda state, tools: ...])
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import random
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent.base import CampaignState, GiveUp, Proposal, Tools
from agent.errors import ActionDenied, BudgetExhausted

__all__ = [
    "Entry",
    "Reply",
    "HTTPError",
    "Slow",
    "call",
    "reply",
    "say",
    "ScriptedOpenAIServer",
    "FakeTools",
    "FakeProposer",
    "make_state",
]


# ----------------------------------------------------------------------------- scripted OpenAI server


@dataclass(frozen=True)
class Reply:
    """One assistant message: text, tool calls, or both; token counts are estimated unless given."""

    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    with_usage: bool = True


@dataclass(frozen=True)
class HTTPError:
    """An HTTP error answer (429 rate limit, 500, 503, 400 context-length...)."""

    status: int
    message: str = "scripted error"
    retry_after: float | None = 0.01  # the Retry-After header in seconds (None: no header)


@dataclass(frozen=True)
class Slow:
    """Wait `seconds` before answering with `then` (a client with a shorter timeout gives up first)."""

    seconds: float
    then: Reply = Reply(content="too late")


Entry = Reply | HTTPError | Slow | Callable[[dict[str, Any]], "Reply | HTTPError | Slow"]
_ids = itertools.count(1)


def call(
    name: str, arguments: dict[str, Any] | str | None = None, /, *, id: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    """A tool call; `arguments` as a str is sent verbatim (use it for malformed JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps({**(arguments or {}), **kwargs})
    return {
        "id": id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def reply(*calls: dict[str, Any], content: str | None = None, **tokens: Any) -> Reply:
    return Reply(content=content, tool_calls=calls, **tokens)


def say(text: str) -> Reply:
    return Reply(content=text)


class ScriptedOpenAIServer:
    """POST /v1/chat/completions answered by the next script entry, on 127.0.0.1 (a free port).

    `requests` holds every request body (parsed JSON) in arrival order, including retried ones. When the
    script runs out the server answers `on_exhausted` (default HTTP 418: not retried by clients, so a test
    that under-scripts fails fast with a clear message).
    """

    def __init__(
        self,
        script: Iterable[Entry] = (),
        *,
        model: str = "scripted",
        on_exhausted: HTTPError = HTTPError(418, "ScriptedOpenAIServer: script exhausted", retry_after=None),
    ) -> None:
        self.model = model
        self.on_exhausted = on_exhausted
        self.requests: list[dict[str, Any]] = []
        self.answered: list[Reply | HTTPError | Slow] = []
        self._script: list[Entry] = list(script)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def __enter__(self) -> ScriptedOpenAIServer:
        handler = type("Handler", (_Handler,), {"scripted": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "use ScriptedOpenAIServer as a context manager"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def push(self, *entries: Entry) -> None:
        with self._lock:
            self._script.extend(entries)

    @property
    def remaining(self) -> int:
        return len(self._script)

    def tool_results(self, index: int = -1) -> list[str]:
        """The tool-result messages of request `index` (what the agent told the model)."""
        return [m["content"] for m in self.requests[index]["messages"] if m.get("role") == "tool"]

    # -- answering
    def _next(self, body: dict[str, Any]) -> Reply | HTTPError | Slow:
        with self._lock:
            self.requests.append(body)
            entry = self._script.pop(0) if self._script else self.on_exhausted
        while callable(entry):
            entry = entry(body)
        with self._lock:
            self.answered.append(entry)
        return entry

    def completion(self, body: dict[str, Any], answer: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = list(answer.tool_calls)
        out_chars = len(answer.content or "") + sum(len(c["function"]["arguments"]) for c in answer.tool_calls)
        prompt = (
            answer.prompt_tokens
            if answer.prompt_tokens is not None
            else len(json.dumps(body.get("messages", []))) // 4 + 1
        )
        completion = answer.completion_tokens if answer.completion_tokens is not None else out_chars // 4 + 1
        data: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if answer.tool_calls else "stop",
                }
            ],
        }
        if answer.with_usage:
            data["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        return data


class _Handler(BaseHTTPRequestHandler):
    scripted: ScriptedOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.scripted.model, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "body is not JSON"}})
            return
        entry = self.scripted._next(body)
        if isinstance(entry, Slow):
            if self.scripted._stop.wait(entry.seconds):
                return
            entry = entry.then
        if isinstance(entry, HTTPError):
            headers = {} if entry.retry_after is None else {"Retry-After": str(entry.retry_after)}
            self._send(
                entry.status,
                {"error": {"message": entry.message, "type": "scripted", "code": entry.status}},
                headers,
            )
            return
        self._send(200, self.scripted.completion(body, entry))


# ----------------------------------------------------------------------------- in-memory Tools


@dataclass
class FakeTools:
    """An in-memory `Tools`: files in a dict, globs denied with a reason, budgets with limits.

    check_patch: SEARCH/REPLACE becomes a diff (sandbox.search_replace), then the same path checks as the
    real one, the deny list and `writable` globs (ActionDenied), and `git apply --check` against the files
    written to a temporary folder; it returns the unified diff like the real one.
    """

    files: dict[str, str] = field(default_factory=dict)
    deny: dict[str, str] = field(default_factory=dict)  # glob -> reason (reads and writes)
    writable: tuple[str, ...] = ("vllm/*", "serving.yaml")
    budgets: dict[str, float] = field(default_factory=dict)  # resource -> limit; absent: unlimited
    spent: dict[str, float] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    notes: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # diffs that passed check_patch
    # try_patch: each result in turn (str, or a callable of the checked diff); none: no trials here
    trial_results: list[str | Callable[[str], str]] | None = None

    def _deny(self, path: str) -> None:
        for glob, reason in self.deny.items():
            if fnmatch.fnmatch(path, glob):
                raise ActionDenied(f"fake-deny:{glob}", reason)

    def read_file(self, path: str) -> str:
        self.calls.append(("read_file", {"path": path}))
        self._deny(path)
        if path not in self.files:
            raise FileNotFoundError(f"{path}: no such file in the workspace")
        return self.files[path]

    def list_files(self, directory: str) -> list[str]:
        self.calls.append(("list_files", {"directory": directory}))
        prefix = directory.strip("/") + "/" if directory.strip("/. ") else ""
        self._deny(prefix.rstrip("/") or ".")
        children = set()
        for path in self.files:
            if path.startswith(prefix):
                head, sep, _ = path[len(prefix) :].partition("/")
                children.add(prefix + head + ("/" if sep else ""))
        if not children:
            raise FileNotFoundError(f"{directory}: no such directory in the workspace")
        return sorted(children)

    def search(self, pattern: str, directory: str = "vllm") -> list[str]:
        self.calls.append(("search", {"pattern": pattern, "directory": directory}))
        self._deny(directory)
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"bad regex {pattern!r}: {exc}") from exc
        prefix = directory.strip("/") + "/"
        return [
            f"{path}:{n}: {line.strip()[:160]}"
            for path, text in sorted(self.files.items())
            if path.startswith(prefix) and path.endswith(".py")
            for n, line in enumerate(text.splitlines(), 1)
            if regex.search(line)
        ]

    def check_patch(self, patch: str, patch_format: str = "diff") -> str:
        from sandbox.errors import PatchRejected
        from sandbox.patches import check_patch_paths
        from sandbox.search_replace import blocks_to_diff

        self.calls.append(("check_patch", {"patch": patch, "patch_format": patch_format}))
        with tempfile.TemporaryDirectory(prefix="faketools-") as tmp:
            root = Path(tmp)
            for path, text in self.files.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
            if patch_format == "search_replace":
                diff = blocks_to_diff(root, patch)
            elif patch_format == "diff":
                diff = patch if patch.endswith("\n") else patch + "\n"
            else:
                raise PatchRejected(f"unknown patch format {patch_format!r}; use 'diff' or 'search_replace'")
            for path in check_patch_paths(diff):
                self._deny(path)
                if not any(fnmatch.fnmatch(path, glob) for glob in self.writable):
                    raise ActionDenied("fake-writable", f"{path} is outside the allowed paths {self.writable}")
            proc = subprocess.run(
                ["git", "apply", "--check", "--whitespace=nowarn", "-"],
                cwd=root,
                input=diff.encode(),
                capture_output=True,
                timeout=60,
            )
            if proc.returncode != 0:
                raise PatchRejected(f"git apply --check failed: {proc.stderr.decode(errors='replace').strip()}")
        self.checked.append(diff)
        return diff

    def try_patch(self, patch: str, patch_format: str = "diff", cells: list[str] | None = None) -> str:
        self.calls.append(("try_patch", {"patch": patch, "patch_format": patch_format, "cells": cells}))
        if self.trial_results is None:
            raise ActionDenied("builtin-trials", "this campaign runs no trials")
        diff = self.check_patch(patch, patch_format)
        if self.budget_left("trials") < 1:
            raise ActionDenied("budget-limit", "trials: the campaign's budget is used up")
        self.spent["trials"] = self.spent.get("trials", 0.0) + 1
        result = self.trial_results.pop(0)
        return result(diff) if callable(result) else result

    def charge(self, resource: str, amount: float) -> None:
        self.calls.append(("charge", {"resource": resource, "amount": amount}))
        if amount <= 0:
            return
        self.spent[resource] = self.spent.get(resource, 0.0) + float(amount)
        if self.budget_left(resource) <= 0:
            raise BudgetExhausted(f"{resource}: budget of {self.budgets[resource]} exhausted")

    def budget_left(self, resource: str) -> float:
        limit = self.budgets.get(resource)
        return float("inf") if limit is None else max(0.0, limit - self.spent.get(resource, 0.0))

    def note(self, kind: str, payload: dict[str, object]) -> None:
        json.dumps(payload)  # the real log needs JSON-able payloads: fail here as it would there
        self.notes.append((kind, payload))

    def notes_of(self, kind: str) -> list[dict[str, object]]:
        return [payload for k, payload in self.notes if k == kind]


# ----------------------------------------------------------------------------- scripted Proposer

ProposerStep = Proposal | GiveUp | Exception | Callable[[CampaignState, Tools], "Proposal | GiveUp"]


_SCRIPT_DONE = GiveUp("FakeProposer: script exhausted")


class FakeProposer:
    """Returns (or raises) its script in order; a callable step gets (state, tools) and returns a result.
    After the script: `when_done` (default GiveUp). Records every state it was shown in `seen`."""

    name = "fake"
    reads_profile = False

    def __init__(self, script: Iterable[ProposerStep] = (), *, when_done: Proposal | GiveUp = _SCRIPT_DONE) -> None:
        self._script: Iterator[ProposerStep] = iter(list(script))
        self.when_done = when_done
        self.seen: list[CampaignState] = []

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        self.seen.append(state)
        step = next(self._script, self.when_done)
        if isinstance(step, Exception):
            raise step
        if callable(step) and not isinstance(step, Proposal | GiveUp):
            return step(state, tools)
        return step


def make_state(**overrides: Any) -> CampaignState:
    """A small but complete CampaignState for proposer tests."""
    base: dict[str, Any] = {
        "iteration": 1,
        "incumbent_ref": "abc1234",
        "serving_config": {"enforce_eager": True, "dtype": "float32", "max_num_seqs": 8},
        "incumbent_metrics": (
            {
                "cell": "in64/out8",
                "input_len": 64,
                "output_len": 8,
                "repeats": 3,
                "output_throughput": 120.5,
                "total_token_throughput": 1080.2,
                "mean_ttft_ms": 40.1,
                "cv_headline": 0.02,
            },
        ),
        "baseline_metrics": (
            {
                "cell": "in64/out8",
                "input_len": 64,
                "output_len": 8,
                "repeats": 3,
                "output_throughput": 110.0,
                "total_token_throughput": 990.0,
                "mean_ttft_ms": 44.0,
                "cv_headline": 0.03,
            },
        ),
        "budget_left": {"llm_tokens": 100_000.0, "llm_usd": 5.0},
        "allowed_paths": ("vllm/**", "serving.yaml"),
        "baseline_serving_config": {"enforce_eager": True, "dtype": "float32", "max_num_seqs": 4},
    }
    base.update(overrides)
    return CampaignState(**base)
