"""The LLM agent's function tools: JSON schemas for the model and `ToolBox`, which runs one tool call
through the campaign's gated `Tools` and turns every failure into a tool-result text for the model.

    list_files(directory)                     read_file(path, start_line?, end_line?)
    search(pattern, directory?)               view_metrics()            view_profile()
    try_patch(patch, format?, cells?)          -> a trial: parity on visible prompts, a speed hint, the traceback
    propose_patch(hypothesis, patch, format?, predicted_speedup?, target_cells?)   -> check_patch
    submit()  -> the last checked Proposal    give_up(reason)  -> GiveUp

Only `BudgetExhausted` leaves `ToolBox.dispatch`; denials, bad arguments, unknown tools and failed
checks come back as text so the conversation goes on. A call identical to an earlier one (same tool,
same arguments) is answered without running it again: a trial with the earlier trial's result, anything
else from its third time on with a note to do something else (small models loop on one call).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.base import CampaignState, GiveUp, Proposal, Tools
from agent.errors import ActionDenied, AgentError, BudgetExhausted
from agent.proposers.llm_config import LLMConfig
from agent.proposers.llm_prompt import render_metrics, render_serving
from sandbox.errors import SandboxError

__all__ = ["TOOL_SCHEMAS", "ToolBox", "ToolOutcome", "calls_in_text", "tool_names", "tool_schemas"]

# Failures a Tools call may raise that the model should hear about (anything else is a bug: it propagates).
_TOOL_ERRORS = (AgentError, SandboxError, OSError, ValueError, LookupError, subprocess.SubprocessError)


# maxLength on short strings also bounds grammar-constrained servers (llama.cpp), where a weak model can
# otherwise fill a path argument until the context is full.
_SHORT = 256


class _Args(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ListFilesArgs(_Args):
    directory: str = Field(
        max_length=_SHORT,
        description="Directory relative to the workspace root, e.g. 'vllm/model_executor'.",
    )


class ReadFileArgs(_Args):
    path: str = Field(max_length=_SHORT, description="File path relative to the workspace root.")
    start_line: int | None = Field(default=None, ge=1, description="First line to show (1-based).")
    end_line: int | None = Field(default=None, ge=1, description="Last line to show (inclusive).")


class SearchArgs(_Args):
    pattern: str = Field(max_length=_SHORT, description="Python regular expression matched against each line.")
    directory: str = Field(default="vllm", max_length=_SHORT, description="Directory to search under (Python files).")


class NoArgs(_Args):
    pass


class ProposePatchArgs(_Args):
    hypothesis: str = Field(min_length=1, description="What should move, where, and by how much, and why.")
    patch: str = Field(min_length=1, description="The change: a unified diff or SEARCH/REPLACE blocks.")
    format: Literal["diff", "search_replace"] = Field(default="diff", description="Patch format.")
    predicted_speedup: float | None = Field(default=None, gt=0, description="Expected throughput ratio, e.g. 1.05.")
    target_cells: list[str] = Field(default_factory=list, description="Benchmark cells expected to move.")


class TryPatchArgs(_Args):
    patch: str = Field(min_length=1, description="The change to try: a unified diff or SEARCH/REPLACE blocks.")
    format: Literal["diff", "search_replace"] = Field(default="diff", description="Patch format.")
    cells: list[str] = Field(default_factory=list, max_length=2, description=(
        "One or two benchmark cells to measure, e.g. ['in512/out64'] (default: the grid's first)."))


class CheckKernelArgs(_Args):
    patch: str = Field(min_length=1, description="The kernel change to check: a unified diff or SEARCH/REPLACE blocks.")
    format: Literal["diff", "search_replace"] = Field(default="diff", description="Patch format.")
    shapes: list[str] = Field(default_factory=list, description=(
        "Names of the spec's shapes to check and time (default: all of them)."))


class GiveUpArgs(_Args):
    reason: str = Field(min_length=1, description="Why no worthwhile change can be proposed now.")


_DESCRIPTIONS: dict[str, tuple[str, type[_Args]]] = {
    "list_files": (
        "List the files and folders of a workspace directory (folders end with '/').",
        ListFilesArgs,
    ),
    "read_file": ("Read a text file of the workspace; long files come in pages of lines.", ReadFileArgs),
    "search": (
        "Search Python files under a directory for a regex; returns 'path:line: text' lines.",
        SearchArgs,
    ),
    "view_metrics": (
        "The incumbent's benchmark metrics per cell (vs the baseline) and its serving config.",
        NoArgs,
    ),
    "view_profile": (
        "The incumbent's profile, when one was taken: the median engine step per phase (wall, GPU busy vs idle, "
        "kernel time by category, launch gaps, CPU time between GPU work), then the top ops.",
        NoArgs,
    ),
    "try_patch": (
        "Try a patch before proposing it: fresh isolated servers of the incumbent and the patched build; "
        "returns 'parity:' (on prompts you may see), 'hint:' (a rough speed ratio, not a verdict) and, when "
        "a server fails, 'server log:' with its Python traceback. Costs minutes and one of few trials.",
        TryPatchArgs,
    ),
    "check_kernel": (
        "Check a kernel patch before proposing it: the harness's correctness checks (before and after timing) and "
        "a timing beside the incumbent on the named shapes; returns 'correctness:', 'hint:' (a rough ratio, not a "
        "verdict) and, when the kernel does not load or raises, its error text. Costs one of few trials.",
        CheckKernelArgs,
    ),
    "propose_patch": (
        "Check a patch (policy gate + git apply --check). On success it becomes the proposal "
        "that submit() hands over; on failure the error says what to fix.",
        ProposePatchArgs,
    ),
    "submit": (
        "Hand the last patch that passed propose_patch over for verification; ends this iteration.",
        NoArgs,
    ),
    "give_up": ("End this iteration without a proposal.", GiveUpArgs),
}


def _schema(model: type[_Args]) -> dict[str, Any]:
    """The model's JSON schema, flattened for small servers' grammars (no titles, no anyOf-null)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        prop = dict(model.model_json_schema()["properties"][name])
        prop.pop("title", None)
        prop.pop("default", None)
        if "anyOf" in prop:
            prop.update(next(p for p in prop.pop("anyOf") if p.get("type") != "null"))
        if "items" in prop:
            prop["items"] = {k: v for k, v in prop["items"].items() if k != "title"}
        props[name] = prop
        if info.is_required():
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": _schema(model)}}
    for name, (desc, model) in _DESCRIPTIONS.items()
]
# Each target's own inner-loop tool: serving campaigns try patches on servers, kernel campaigns check kernels.
_NOT_FOR = {"serving": {"check_kernel"}, "kernel": {"try_patch"}}


def tool_names() -> list[str]:
    return list(_DESCRIPTIONS)


def tool_schemas(target: str) -> list[dict[str, Any]]:
    """The tools offered for a campaign target ("serving" or "kernel")."""
    return [t for t in TOOL_SCHEMAS if t["function"]["name"] not in _NOT_FOR.get(target, set())]


@dataclass(frozen=True)
class ToolOutcome:
    content: str  # the tool-result message the model reads
    final: Proposal | GiveUp | None = None  # set by submit / give_up: the conversation ends
    ok: bool = True


@dataclass
class ToolBox:
    tools: Tools
    state: CampaignState
    config: LLMConfig
    source: str = "llm"
    checked: Proposal | None = None  # the last proposal that passed check_patch
    attempts: list[dict[str, object]] = field(default_factory=list)  # every propose_patch and its outcome
    seen: dict[str, int] = field(default_factory=dict)  # calls so far, by tool name and canonical arguments
    trial_results: dict[str, str] = field(default_factory=dict)  # try_patch results, by canonical arguments
    refused_repeats: int = 0  # REPEATED answers so far (the proposer ends the iteration past its limit)

    def dispatch(self, name: str, raw_arguments: str | None) -> ToolOutcome:
        name = (name or "").strip().removeprefix("functions.")
        offered = [n for n in _DESCRIPTIONS if n not in _NOT_FOR.get(self.state.target, set())]
        if name not in offered:
            return ToolOutcome(f"ERROR: unknown tool {name!r}; available tools: {', '.join(offered)}.", ok=False)
        try:
            args = _DESCRIPTIONS[name][1].model_validate(_parse_arguments(raw_arguments))
        except (ValueError, ValidationError) as exc:
            return ToolOutcome(
                f"ERROR: bad arguments for {name}: {_short(exc)}. Call it again with a JSON "
                f"object matching its schema.",
                ok=False,
            )
        key = f"{name} {json.dumps(args.model_dump(), sort_keys=True)}"
        self.seen[key] = self.seen.get(key, 0) + 1
        if name in ("try_patch", "check_kernel") and key in self.trial_results:
            return ToolOutcome("REPEATED: you tried exactly this patch already (no new trial was run); its result "
                               f"was:\n{self.trial_results[key]}", ok=False)
        if self.seen[key] >= 3 and name not in ("submit", "give_up"):
            self.refused_repeats += 1
            return ToolOutcome(f"REPEATED: this is call {self.seen[key]} of {name} with the same arguments; its "
                               "result has not changed. Do something else: read another part of the code, try or "
                               "propose a patch, or give_up(reason).", ok=False)
        handler: Callable[[Any], ToolOutcome] = getattr(self, f"_{name}")
        try:
            return handler(args)
        except BudgetExhausted:
            raise
        except ActionDenied as exc:
            return ToolOutcome(
                f"DENIED by policy rule {exc.rule}: {exc.reason}. This action is not allowed; do something else.",
                ok=False,
            )
        except _TOOL_ERRORS as exc:
            return ToolOutcome(f"ERROR: {name} failed: {type(exc).__name__}: {_short(exc)}", ok=False)

    def _cut(self, text: str, hint: str) -> str:
        limit = self.config.tool_result_max_chars
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n[truncated at {limit} of {len(text)} characters; {hint}]"

    def _list_files(self, args: ListFilesArgs) -> ToolOutcome:
        entries = self.tools.list_files(args.directory)
        return ToolOutcome(self._cut("\n".join(entries) or "(empty directory)", "list a subdirectory"))

    def _read_file(self, args: ReadFileArgs) -> ToolOutcome:
        lines = self.tools.read_file(args.path).splitlines()
        total = len(lines)
        start = args.start_line or 1
        end = min(args.end_line or total, total, start + self.config.read_max_lines - 1)
        if total and start > total:
            return ToolOutcome(f"ERROR: {args.path} has only {total} lines.", ok=False)
        body = "\n".join(lines[start - 1 : end])
        header = f"{args.path} (lines {start}-{end} of {total})"
        note = ""
        if end < total and (args.end_line is None or end < args.end_line):
            note = (
                f"\n[truncated: showing lines {start}-{end} of {total}; "
                f"call read_file with start_line={end + 1} to read on]"
            )
        return ToolOutcome(self._cut(f"{header}\n{body}{note}", "ask for fewer lines"))

    def _search(self, args: SearchArgs) -> ToolOutcome:
        hits = self.tools.search(args.pattern, args.directory)
        shown = hits[: self.config.search_max_hits]
        more = f"\n[{len(hits) - len(shown)} more hits not shown; narrow the pattern]" if len(hits) > len(shown) else ""
        return ToolOutcome(self._cut("\n".join(shown) or "(no matches)", "narrow the pattern") + more)

    def _view_metrics(self, args: NoArgs) -> ToolOutcome:
        return ToolOutcome(
            f"Incumbent {self.state.incumbent_ref}\n"
            f"{render_metrics(self.state.incumbent_metrics, self.state.baseline_metrics)}\n\n"
            f"serving.yaml:\n{render_serving(self.state.serving_config)}"
        )

    def _view_profile(self, args: NoArgs) -> ToolOutcome:
        return ToolOutcome(self._cut(self.state.profile or "No profile was taken for the incumbent.", "sorry"))

    def _try_patch(self, args: TryPatchArgs) -> ToolOutcome:
        text = self.tools.try_patch(args.patch, args.format, list(args.cells) or None)
        self.trial_results[f"try_patch {json.dumps(args.model_dump(), sort_keys=True)}"] = text
        return ToolOutcome(self._cut(text, "the log's head and tail are kept"), ok="server log:" not in text)

    def _check_kernel(self, args: CheckKernelArgs) -> ToolOutcome:
        text = self.tools.check_kernel(args.patch, args.format, list(args.shapes) or None)
        self.trial_results[f"check_kernel {json.dumps(args.model_dump(), sort_keys=True)}"] = text
        failed = "correctness: ok" not in text
        return ToolOutcome(self._cut(text, "the error's head is kept"), ok=not failed)

    def _propose_patch(self, args: ProposePatchArgs) -> ToolOutcome:
        record: dict[str, object] = {
            "hypothesis": args.hypothesis,
            "patch": args.patch,
            "format": args.format,
            "predicted_speedup": args.predicted_speedup,
        }
        self.attempts.append(record)
        try:
            diff = self.tools.check_patch(args.patch, args.format)
        except BudgetExhausted:
            raise
        except ActionDenied as exc:
            record["outcome"] = f"denied: {exc.rule}: {exc.reason}"
            return ToolOutcome(
                f"DENIED by policy rule {exc.rule}: {exc.reason}. Change only allowed paths "
                f"({', '.join(self.state.allowed_paths) or 'see the system prompt'}).",
                ok=False,
            )
        except _TOOL_ERRORS as exc:
            record["outcome"] = f"rejected: {_short(exc)}"
            return ToolOutcome(
                f"PATCH REJECTED: {_short(exc)}\nFix the patch (copy context lines exactly from "
                f"read_file) and call propose_patch again.",
                ok=False,
            )
        record["outcome"] = "checked"
        self.checked = Proposal(
            hypothesis=args.hypothesis.strip(),
            patch=diff or args.patch,
            patch_format="diff" if diff else args.format,
            predicted_speedup=args.predicted_speedup,
            target_cells=tuple(args.target_cells),
            source=self.source,
        )
        return ToolOutcome(
            "OK: the patch passed the policy gate and git apply --check. Call submit() to hand it "
            "over for verification, or propose_patch again to replace it."
        )

    def _submit(self, args: NoArgs) -> ToolOutcome:
        if self.checked is None:
            return ToolOutcome(
                "ERROR: nothing to submit: only a patch that passed propose_patch can be "
                "submitted. Call propose_patch first.",
                ok=False,
            )
        return ToolOutcome("Submitted for verification.", final=self.checked)

    def _give_up(self, args: GiveUpArgs) -> ToolOutcome:
        return ToolOutcome("Understood.", final=GiveUp(reason=f"model gave up: {args.reason.strip()}"))


_TAGGED = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


def calls_in_text(text: str) -> list[tuple[str, str]]:
    """(name, JSON arguments) of tool calls a server left in the reply text: hermes-style
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` tags, ``` fences holding one such object each
    (Qwen2.5-Coder writes one, then sometimes trailing text), or the whole reply being one. Only names of our
    tools count; anything else is plain text."""
    stripped = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    candidates = _TAGGED.findall(text) or _FENCED.findall(text) or ([stripped] if stripped.startswith("{") else [])
    calls = []
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        name = str(obj.get("name", "")).removeprefix("functions.")
        args = obj.get("arguments", obj.get("parameters", {}))
        if name in _DESCRIPTIONS:
            calls.append((name, args if isinstance(args, str) else json.dumps(args)))
    return calls


def _parse_arguments(raw: str | None) -> dict[str, Any]:
    """JSON object arguments; tolerate empty arguments, raw control characters (newlines) inside strings
    and one level of double encoding."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw, strict=False)
        if isinstance(value, str) and value.strip().startswith("{"):
            value = json.loads(value, strict=False)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def _short(exc: BaseException, limit: int = 1_500) -> str:
    if isinstance(exc, ValidationError):
        text = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
    else:
        text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + " ..."
