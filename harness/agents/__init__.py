"""LLM agent backends: API models (Anthropic, OpenAI and compatible servers), coding-assistant CLIs
and replay of recorded turns, behind two small protocols and one factory:

    agent = make_agent("anthropic:claude-sonnet-4-5")   # ChatAgent: agent.step(...) -> AgentTurn
    agent = make_agent("cli:claude-code")               # SubprocessAgent: agent.attempt(...) -> CliAttempt

SDKs are imported by the backend that uses them, so importing this package needs neither.
"""

from harness.agents.base import Agent, ChatAgent, CliAttempt, SubprocessAgent
from harness.agents.factory import SPEC_FORMS, make_agent

__all__ = ["Agent", "ChatAgent", "SubprocessAgent", "CliAttempt", "make_agent", "SPEC_FORMS"]
