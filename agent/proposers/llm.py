"""`LLMProposer`: a coding agent on the openai SDK (chat completions + function tools).

One conversation per iteration: system prompt (mission, rules) + the rendered `CampaignState`, then turns
of model reply -> tool calls through the gated `Tools` -> tool results, until the model calls submit()
(-> the last checked `Proposal`) or give_up() (-> `GiveUp`), or a limit is hit (-> `GiveUp`).

    budget left? -> compact context -> LLM call (retries) -> note llm.turn -> charge -> dispatch tools

Failure values: bad tool calls, denials and failed patch checks go back to the model as tool results;
plain-text replies get a nudge and end in GiveUp after `max_idle_replies`; `max_turns` ends in GiveUp.
Raised: `BudgetExhausted` (from Tools: the campaign stops cleanly) and `ProposerError` when the server
cannot be reached or refuses the request after bounded retries (the loop records a failed iteration).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import openai
from openai import OpenAI

from agent.base import CampaignState, GiveUp, Proposal, Tools
from agent.errors import BudgetExhausted, ProposerError
from agent.proposers.llm_config import LLMConfig
from agent.proposers.llm_context import compact, conversation_chars
from agent.proposers.llm_prompt import NUDGE, render_state, system_prompt
from agent.proposers.llm_tools import ToolBox, calls_in_text, tool_names, tool_schemas

__all__ = ["LLMProposer", "LLMConfig"]

_RETRYABLE = (
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.RateLimitError,
    openai.InternalServerError,
)
_RETRYABLE_STATUS = {408, 409, 425, 429}
_NOTE_CHARS = 4_000


class LLMProposer:
    name = "llm"
    reads_profile = True

    def __init__(
        self, config: LLMConfig, *, client: OpenAI | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.config = config
        self._client = client or OpenAI(
            base_url=config.base_url,
            api_key=config.api_key(),
            timeout=config.request_timeout_s,
            max_retries=config.max_retries,
        )
        self._sleep = sleep

    def propose(self, state: CampaignState, tools: Tools, *, rng: random.Random) -> Proposal | GiveUp:
        cfg = self.config
        box = ToolBox(tools, state, cfg, source=f"llm:{cfg.model}:iteration-{state.iteration}")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(state, max_turns=cfg.max_turns)},
            {"role": "user", "content": render_state(state, failure_chars=cfg.failure_chars)},
        ]
        idle = 0
        for turn in range(1, cfg.max_turns + 1):
            for resource in ("llm_tokens", "llm_usd"):
                if tools.budget_left(resource) <= 0:
                    raise BudgetExhausted(
                        f"{resource}: no budget left before LLM call {turn} of iteration {state.iteration}"
                    )
            summarised = compact(messages, max_chars=cfg.max_context_chars, keep_recent=cfg.keep_recent_messages)
            response = self._complete(messages, tools, rng=rng, turn=turn, target=state.target)
            reply = _assistant_message(response, turn)
            if not reply.get("tool_calls") and cfg.parse_text_tool_calls:
                found = calls_in_text(reply["content"])
                if found:  # sent back as structured calls so the tool results pair with them
                    reply["tool_calls"] = [
                        {
                            "id": f"text_call_{turn}_{k}",
                            "type": "function",
                            "function": {"name": name, "arguments": args},
                        }
                        for k, (name, args) in enumerate(found)
                    ]
            usage = _usage(response, messages, reply)
            calls = reply.get("tool_calls") or []
            tools.note(
                "llm.turn",
                {
                    "iteration": state.iteration,
                    "turn": turn,
                    "content": _clip(reply["content"]),
                    "tool_calls": [
                        {"name": c["function"]["name"], "arguments": _clip(c["function"]["arguments"])} for c in calls
                    ],
                    "usage": usage,
                    "finish_reason": _finish_reason(response),
                    "context_chars": conversation_chars(messages),
                    "summarised": summarised,
                },
            )
            tools.charge("llm_tokens", usage["total_tokens"])
            tools.charge("llm_usd", cfg.cost_usd(usage["prompt_tokens"], usage["completion_tokens"]))
            messages.append(reply)
            if not calls:
                idle += 1
                if idle >= cfg.max_idle_replies:
                    return self._end(
                        tools,
                        box,
                        GiveUp(f"no tool call in {idle} replies (last: {reply['content'][:200]!r})"),
                        turn,
                    )
                messages.append({"role": "user", "content": _nudge(reply["content"], _finish_reason(response),
                                                                   cfg.max_tokens)})
                continue
            as_user: list[str] = []
            for call in calls:
                outcome = box.dispatch(call["function"]["name"], call["function"]["arguments"])
                if cfg.tool_results_as == "tool":
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": outcome.content})
                else:
                    as_user.append(f"Result of functions.{call['function']['name']}:\n{outcome.content}")
                if not outcome.ok:
                    tools.note(
                        "llm.tool_error",
                        {
                            "iteration": state.iteration,
                            "turn": turn,
                            "tool": call["function"]["name"],
                            "result": _clip(outcome.content),
                        },
                    )
                if outcome.final is not None:
                    return self._end(tools, box, outcome.final, turn)
                if box.refused_repeats >= cfg.max_repeated_calls:
                    return self._end(tools, box, GiveUp(
                        f"{box.refused_repeats} identical calls answered REPEATED (the last: "
                        f"{call['function']['name']}); the model did not move on"), turn)
            if as_user:
                messages.append({"role": "user", "content": "\n\n".join(as_user)})
        return self._end(
            tools,
            box,
            GiveUp(
                f"max_turns={cfg.max_turns} reached without submit()"
                + (" (a checked patch was left unsubmitted)" if box.checked else "")
            ),
            cfg.max_turns,
        )

    def _end(self, tools: Tools, box: ToolBox, result: Proposal | GiveUp, turns: int) -> Proposal | GiveUp:
        tools.note(
            "llm.end",
            {
                "turns": turns,
                "result": "proposal" if isinstance(result, Proposal) else "give_up",
                "reason": getattr(result, "reason", ""),
                "hypothesis": getattr(result, "hypothesis", ""),
                "attempts": [
                    {"hypothesis": _clip(str(a["hypothesis"]), 500), "outcome": a.get("outcome", "")}
                    for a in box.attempts
                ],
            },
        )
        return result

    def _complete(self, messages: list[dict[str, Any]], tools: Tools, *, rng: random.Random, turn: int,
                  target: str = "serving") -> Any:
        """One chat completion, with bounded retry rounds around the client's own retries."""
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "tools": tool_schemas(target),
            "tool_choice": cfg.tool_choice,
            "temperature": cfg.temperature,
        }
        if cfg.max_tokens is not None:
            kwargs["max_tokens"] = cfg.max_tokens
        shrunk = False
        last: Exception | None = None
        for attempt in range(1, cfg.retry_rounds + 1):
            if cfg.send_seed:  # a fresh seed per round: a server error caused by one sample is not repeated
                kwargs["seed"] = rng.randrange(2**31)
            try:
                return self._client.chat.completions.create(**kwargs)
            except openai.BadRequestError as exc:
                if _is_context_error(exc) and not shrunk:
                    shrunk = True
                    compact(messages, max_chars=cfg.max_context_chars // 2, keep_recent=2)
                    tools.note("llm.context_shrunk", {"turn": turn, "error": _clip(str(exc), 500)})
                    continue
                raise ProposerError(
                    f"{cfg.base_url} rejected the request (400): {_clip(str(exc), 500)}; "
                    f"check llm.model and the server's tool-call support"
                ) from exc
            except _RETRYABLE as exc:
                last = exc
            except openai.APIStatusError as exc:
                if exc.status_code not in _RETRYABLE_STATUS and exc.status_code < 500:
                    raise ProposerError(
                        f"{cfg.base_url} answered HTTP {exc.status_code}: {_clip(str(exc), 500)}; "
                        f"check llm.base_url, llm.model and the key in ${cfg.api_key_env}"
                    ) from exc
                last = exc
            tools.note(
                "llm.retry",
                {"turn": turn, "attempt": attempt, "error": _clip(f"{type(last).__name__}: {last}", 500)},
            )
            if attempt < cfg.retry_rounds:
                wait = min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1))
                self._sleep(wait * (1 + 0.25 * rng.random()))
        raise ProposerError(
            f"{cfg.base_url}: no answer after {cfg.retry_rounds} rounds of "
            f"{cfg.max_retries + 1} tries ({type(last).__name__}: {_clip(str(last), 300)}); "
            f"is the server up and not overloaded? Raise llm.request_timeout_s or retry later"
        )


def _assistant_message(response: Any, turn: int) -> dict[str, Any]:
    """The reply as a plain dict for the next request; tool calls get ids when the server gave none."""
    choices = getattr(response, "choices", None) or []
    message = choices[0].message if choices else None
    content = (getattr(message, "content", None) or "") if message is not None else ""
    calls = []
    for k, call in enumerate(getattr(message, "tool_calls", None) or []):
        function = getattr(call, "function", None)
        calls.append(
            {
                "id": getattr(call, "id", None) or f"call_{turn}_{k}",
                "type": "function",
                "function": {
                    "name": str(getattr(function, "name", "") or ""),
                    "arguments": str(getattr(function, "arguments", "") or ""),
                },
            }
        )
    reply: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = calls
    return reply


def _usage(response: Any, messages: list[dict[str, Any]], reply: dict[str, Any]) -> dict[str, Any]:
    """Token counts from `response.usage`; estimated (chars / 4) when the server reports none."""
    usage = getattr(response, "usage", None)
    if usage is not None and getattr(usage, "total_tokens", None):
        prompt = int(usage.prompt_tokens or 0)
        completion = int(usage.completion_tokens or 0)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(usage.total_tokens),
            "estimated": False,
        }
    prompt = conversation_chars(messages) // 4 + 1
    completion = conversation_chars([reply]) // 4 + 1
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "estimated": True,
    }


def _nudge(content: str, finish_reason: str, max_tokens: int | None) -> str:
    """What to say to a reply without a usable call: a call that does not parse gets told why (small models
    write patches as Python triple-quoted strings, or run past max_tokens repeating themselves)."""
    named = [name for name in tool_names() if f'"{name}"' in content]
    if not named:
        return NUDGE
    cut = f" and was cut off at max_tokens={max_tokens} before it closed" if finish_reason == "length" else ""
    return (f"Your reply looks like a call to {named[0]} but it is not a valid JSON tool call{cut}. Send one call "
            "per reply as JSON: every string in double quotes with newlines written as \\n (no triple quotes), "
            "and keep a patch short: only the lines that change, with three lines of context.")


def _finish_reason(response: Any) -> str:
    choices = getattr(response, "choices", None) or []
    return str(getattr(choices[0], "finish_reason", "") or "") if choices else "no-choices"


def _is_context_error(exc: openai.BadRequestError) -> bool:
    text = str(exc).lower()
    return any(
        s in text
        for s in (
            "context length",
            "context_length",
            "maximum context",
            "too many tokens",
            "prompt is too long",
            "exceeds the context",
            "context window",
        )
    )


def _clip(text: str, limit: int = _NOTE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"
