"""Exceptions of the agent room.

    AgentError
     ├── ActionDenied      the policy gate said no (carries the rule and reason)
     ├── BudgetExhausted   a budget would be overrun; the campaign stops cleanly
     ├── ProposerError     a proposer could not produce a proposal (recorded, the loop goes on)
     └── CampaignError     the campaign cannot start or resume (bad log dir, id mismatch...)
"""

from __future__ import annotations

__all__ = ["AgentError", "ActionDenied", "BudgetExhausted", "ProposerError", "CampaignError"]


class AgentError(Exception):
    """Base for failures the agent room raises on purpose."""


class ActionDenied(AgentError):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"denied by rule {rule}: {reason}")
        self.rule = rule
        self.reason = reason


class BudgetExhausted(AgentError):
    pass


class ProposerError(AgentError):
    pass


class CampaignError(AgentError):
    pass
