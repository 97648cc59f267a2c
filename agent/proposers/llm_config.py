"""`LLMConfig`: how the LLM proposer reaches its model and how far it may go in one iteration.

Works with any OpenAI-compatible chat-completions server that supports tool calls: vLLM's own
(`vllm serve ... --enable-auto-tool-choice --tool-call-parser ...`), llama.cpp's
(`python -m llama_cpp.server --chat_format chatml-function-calling`), or a hosted API.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LLMConfig", "DUMMY_API_KEY"]

DUMMY_API_KEY = "sk-loopback-dummy"


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        default="http://127.0.0.1:8000/v1",
        description="OpenAI-compatible endpoint, including the /v1 suffix.",
    )
    model: str = Field(description="Model name sent with every request (as the server lists it).")
    api_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="Name of the environment variable that holds the API key. A missing "
        "key is fine for a loopback base_url (a dummy is sent).",
    )
    max_turns: int = Field(default=24, ge=1, description="LLM calls per proposal before giving up.")
    max_idle_replies: int = Field(
        default=3,
        ge=1,
        description="Replies without a tool call (plain text, refusals) tolerated per "
        "proposal; each but the last is answered with a nudge, the last "
        "ends the proposal with GiveUp.",
    )
    max_repeated_calls: int = Field(
        default=4,
        ge=1,
        description="Identical calls answered 'REPEATED' per proposal before it ends in GiveUp (a model that "
        "ignores the answer would spend every remaining turn on the same call).",
    )
    temperature: float = Field(default=0.2, ge=0.0, le=2.0, description="Sampling temperature.")
    max_tokens: int | None = Field(
        default=4096, ge=1, description="Completion tokens per reply (None: server default)."
    )
    tool_choice: Literal["auto", "required"] = Field(
        default="auto", description="'required' forces a tool call each turn where the server supports it."
    )
    tool_results_as: Literal["tool", "user"] = Field(
        default="tool",
        description="How tool results go back: 'tool' messages (the OpenAI protocol), or one 'user' message "
        "per turn for servers whose chat template drops tool messages (llama-cpp-python's "
        "chatml-function-calling).",
    )
    parse_text_tool_calls: bool = Field(
        default=True,
        description="Take tool calls that a server left in the reply text (hermes <tool_call> tags, or a "
        "reply that is one JSON object naming a tool) as calls, for servers started without a tool parser.",
    )
    send_seed: bool = Field(
        default=True,
        description="Send a seed drawn from the iteration's rng (reproducibility where the server honours it).",
    )
    failure_chars: int = Field(
        default=6000,
        ge=200,
        description="Characters of the latest failed iteration's text (a crashed server's log tail with its "
        "Python traceback, a parity diagnosis) shown to the model in full; older failures get 300.",
    )
    try_log_chars: int = Field(
        default=8000,
        ge=500,
        description="Characters of a failed try_patch's server log handed back, from its first traceback "
        "(head and tail kept when longer).",
    )
    request_timeout_s: float = Field(default=180.0, gt=0, description="Timeout of one HTTP request, in seconds.")
    max_retries: int = Field(
        default=2,
        ge=0,
        description="Retries inside the openai client (429, 5xx, timeouts, connection errors), with its own backoff.",
    )
    retry_rounds: int = Field(
        default=3,
        ge=1,
        description="Our bounded loop around the client: attempts per LLM call before ProposerError.",
    )
    backoff_s: float = Field(default=2.0, ge=0, description="First wait between our retry rounds; doubles each round.")
    backoff_max_s: float = Field(default=60.0, ge=0, description="Cap on one wait between retry rounds.")
    price_input_per_mtok: float = Field(default=0.0, ge=0, description="USD per 1M prompt tokens (llm_usd metering).")
    price_output_per_mtok: float = Field(default=0.0, ge=0, description="USD per 1M completion tokens.")
    max_context_chars: int = Field(
        default=120_000,
        ge=2_000,
        description="When the conversation grows past this many characters, older "
        "tool results are replaced by one-line summaries.",
    )
    keep_recent_messages: int = Field(default=6, ge=2, description="Newest messages never summarised.")
    read_max_lines: int = Field(
        default=400,
        ge=10,
        description="read_file returns at most this many lines per call (the model pages with start_line/end_line).",
    )
    tool_result_max_chars: int = Field(
        default=24_000, ge=500, description="Any single tool result is cut to this size."
    )
    search_max_hits: int = Field(default=80, ge=1, description="search returns at most this many matching lines.")

    def api_key(self) -> str:
        """The key from `api_key_env`; a dummy for loopback servers; else a ValueError saying what to set."""
        key = os.environ.get(self.api_key_env, "")
        if key:
            return key
        if self.is_loopback():
            return DUMMY_API_KEY
        raise ValueError(
            f"no API key: set the environment variable {self.api_key_env} for {self.base_url} "
            f"(or point llm.api_key_env at the variable that holds it)"
        )

    def is_loopback(self) -> bool:
        host = urlparse(self.base_url).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_input_per_mtok + completion_tokens * self.price_output_per_mtok) / 1e6
