"""Proposers: what turns a `CampaignState` into a `Proposal` or a `GiveUp` (see agent/base.py, README.md).

    search.py       engine-arg search over serving.yaml (no LLM)
    llm.py          LLMProposer: a coding agent on an OpenAI-compatible server (tool calls)
    llm_config.py   LLMConfig: endpoint, model, limits, retries, prices
    llm_tools.py    the agent's function tools and their dispatch through the gated Tools
    llm_prompt.py   system prompt and state rendering
    llm_context.py  summarising older messages to stay under max_context_chars

Import the one you need (`from agent.proposers.llm import LLMProposer`); this package imports nothing, so
the search proposer never loads the openai SDK.
"""
