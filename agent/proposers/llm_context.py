"""Keep an LLM conversation under a character budget by summarising older messages in place.

The system prompt, the state message and the newest `keep_recent` messages are never touched; older tool
results go first (they are the bulk: file reads, searches), then older assistant text, then older tool-call
arguments (patches). Each summary is one line that tells the model how to get the content back.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["conversation_chars", "compact"]

_HEAD = 2  # system + the rendered state
_MIN_SUMMARY = 240  # shorter messages are not worth summarising
_ELIDED_ARGS = json.dumps({"note": "arguments elided to save context"})


def _chars(message: dict[str, Any]) -> int:
    size = len(str(message.get("content") or ""))
    for call in message.get("tool_calls") or ():
        size += len(call["function"].get("arguments") or "") + len(call["function"].get("name") or "")
    return size


def conversation_chars(messages: list[dict[str, Any]]) -> int:
    return sum(_chars(m) for m in messages)


def _summary(text: str, what: str) -> str:
    first = text.strip().splitlines()[0][:120] if text.strip() else ""
    return f"[{what} summarised to save context ({len(text)} chars); began: {first!r}. Call the tool again if needed.]"


def compact(messages: list[dict[str, Any]], *, max_chars: int, keep_recent: int) -> int:
    """Summarise older messages until the conversation fits `max_chars`; return how many were changed."""
    size = conversation_chars(messages)
    if size <= max_chars:
        return 0
    changed = 0
    middle = range(_HEAD, max(_HEAD, len(messages) - keep_recent))
    for role in ("tool", "user", "assistant"):  # user: tool results sent as user messages
        for i in middle:
            if size <= max_chars:
                return changed
            msg = messages[i]
            text = str(msg.get("content") or "")
            if msg.get("role") != role or len(text) < _MIN_SUMMARY or "summarised to save context" in text[:60]:
                continue
            new = _summary(text, {"tool": "tool result", "user": "message"}.get(role, "earlier reply"))
            msg["content"] = new
            size -= len(text) - len(new)
            changed += 1
    for i in middle:
        if size <= max_chars:
            break
        for call in messages[i].get("tool_calls") or ():
            args = call["function"].get("arguments") or ""
            if len(args) >= _MIN_SUMMARY:
                call["function"]["arguments"] = _ELIDED_ARGS
                size -= len(args) - len(_ELIDED_ARGS)
                changed += 1
    return changed
