"""Spec parsing, the replay backend and the price table."""

import json

import pytest

from harness.agents import SPEC_FORMS, ChatAgent, SubprocessAgent, make_agent
from harness.agents.cli_agents import ClaudeCodeAgent, CodexAgent
from harness.agents.pricing import cost_usd, price_for
from harness.agents.replay import ReplayAgent
from harness.protocol import AgentError, AgentTurn, Message, ToolCall, Usage
from tests.loopback import anthropic_wire as aw

__all__: list[str] = []


def test_specs_build_their_backends(tmp_path):
    trajectory = tmp_path / "t.jsonl"
    trajectory.write_text(json.dumps({"type": "turn", **AgentTurn(text="hi").to_json()}) + "\n")
    anthropic = make_agent("anthropic:claude-opus-5", api_key="k")
    openai = make_agent("openai:gpt-5", api_key="k")
    compatible = make_agent("openai-compatible:http://127.0.0.1:8000/v1#Qwen/Qwen3-Coder-30B")
    claude = make_agent("cli:claude-code", model="opus")
    codex = make_agent("cli:codex")
    replay = make_agent(f"replay:{trajectory}")
    assert (anthropic.name, anthropic.base_url) == ("anthropic:claude-opus-5", "https://api.anthropic.com")
    assert (openai.name, openai.base_url) == ("openai:gpt-5", "https://api.openai.com/v1")
    assert (compatible.base_url, compatible.model) == ("http://127.0.0.1:8000/v1", "Qwen/Qwen3-Coder-30B")
    assert isinstance(claude, ClaudeCodeAgent) and claude.model == "opus" and isinstance(codex, CodexAgent)
    for agent in (anthropic, openai, compatible, replay):
        assert isinstance(agent, ChatAgent)
    for agent in (claude, codex):
        assert isinstance(agent, SubprocessAgent)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "anthropic",
        "anthropic:",
        "anthropic: claude-opus-5",
        "gemini:pro",
        "openai-compatible:localhost:8000/v1#m",
        "openai-compatible:http://localhost:8000/v1",
        "openai-compatible:http://localhost:8000/v1#",
        "openai-compatible:#m",
        "cli:cursor",
        "cli:",
        "replay:",
    ],
)
def test_malformed_specs_name_the_spec_and_the_accepted_forms(spec):
    with pytest.raises(ValueError) as caught:
        make_agent(spec, api_key="k") if spec.startswith(("anthropic", "openai:")) else make_agent(spec)
    message = str(caught.value)
    assert repr(spec) in message
    assert all(form in message for form in SPEC_FORMS)


def test_unknown_option_lists_the_accepted_ones():
    with pytest.raises(ValueError, match=r"takes no option\(s\) temprature; it accepts: .*max_retries"):
        make_agent("anthropic:claude-opus-5", api_key="k", temprature=0.2)
    with pytest.raises(ValueError, match="base_url comes from the spec"):
        make_agent("openai-compatible:http://h/v1#m", base_url="http://other/v1")


def test_replay_plays_turns_in_order_then_is_exhausted(tmp_path):
    turns = [
        AgentTurn(
            text="", tool_calls=(ToolCall("c1", "read", {"path": "a"}),), stop_reason="tool_use", usage=Usage(1, 2)
        ),
        AgentTurn(text="done", usage=Usage(3, 4, cost_usd=0.5), model="m"),
    ]
    path = tmp_path / "trajectory.jsonl"
    path.write_text("".join(json.dumps({"type": "turn", **t.to_json()}) + "\n" for t in turns) + "\n")
    agent = make_agent(f"replay:{path}")
    conversation = [Message(role="user", text="go")]
    assert agent.step("s", conversation, [], 10) == turns[0]
    assert agent.step("s", conversation, [], 10) == turns[1]
    with pytest.raises(AgentError, match="replay exhausted after 2 turns"):
        agent.step("s", conversation, [], 10)


def test_replay_reads_run_events(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    recorded = AgentTurn(text="from the run", usage=Usage(5, 6, cost_usd=None))
    events = [
        {"type": "run_started", "run": "r1"},
        {"type": "llm_call", "turn": recorded.to_json(), "tokens": 11},
        {"type": "tool_call", "name": "read"},
        {"type": "gate", "verdict": "fail"},
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for spec in (f"replay:{run / 'events.jsonl'}", f"replay:{run}"):
        agent = make_agent(spec)
        assert agent.step("", [], [], 1) == recorded
        with pytest.raises(AgentError, match="replay exhausted after 1 turns"):
            agent.step("", [], [], 1)


def test_replay_rejects_missing_empty_and_broken_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        make_agent(f"replay:{tmp_path / 'nope.jsonl'}")
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"type": "gate"}) + "\n")
    with pytest.raises(ValueError, match="no recorded turns"):
        make_agent(f"replay:{empty}")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "turn", "text": "a"}\n{not json\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not JSON"):
        make_agent(f"replay:{broken}")


def test_recorded_api_turns_replay_identically(tmp_path):
    """Turns recorded from a real SDK conversation (thinking blocks included) replay unchanged."""
    with aw.anthropic_server() as server:
        server.enqueue(
            aw.reply(
                aw.message(aw.thinking("hm"), aw.tool_use("toolu_1", "read", {"path": "a"}), stop_reason="tool_use")
            ),
            aw.reply(aw.message(aw.text("finished"))),
        )
        live = make_agent("anthropic:claude-opus-5", api_key="k", base_url=server.url)
        recorded = [live.step("", [Message(role="user", text="go")], [], 10) for _ in range(2)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"type": "turn", **t.to_json()}) + "\n" for t in recorded))
    replay = ReplayAgent.from_path(path)
    assert [replay.step("", [], [], 10) for _ in range(2)] == recorded


def test_price_table_lookup():
    assert price_for("claude-opus-5") == price_for("claude-opus-4-5-20251101")
    assert price_for("claude-opus-4-20250514").input == 15.00
    assert price_for("gpt-4o-mini-2024-07-18").output == 0.60
    assert price_for("gpt-4o-mini").input == 0.15 and price_for("gpt-4o").input == 2.50
    for unknown in ("gpt-5.3", "claude-opus-4-5-experimental", "llama-3-70b", "", "claude-haiku-5-5"):
        assert price_for(unknown) is None
        assert cost_usd(unknown, input_tokens=10, output_tokens=10) is None


def test_cost_formula_by_hand():
    # Haiku 4.5: input 1.00, output 5.00, cache write 1.25, cache read 0.10 USD per MTok.
    cost = cost_usd(
        "claude-haiku-4-5", input_tokens=2_000, output_tokens=1_000, cache_write_tokens=4_000, cache_read_tokens=10_000
    )
    assert cost == pytest.approx((2_000 * 1.00 + 1_000 * 5.00 + 4_000 * 1.25 + 10_000 * 0.10) / 1e6, rel=1e-12)
    assert cost_usd("gpt-5", input_tokens=0, output_tokens=0) == 0.0


def test_usage_sum_keeps_unknown_cost_unknown():
    assert (Usage(1, 1, cost_usd=0.1) + Usage(1, 1, cost_usd=None)).cost_usd is None
