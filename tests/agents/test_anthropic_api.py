"""The Anthropic backend end to end: the real `anthropic` SDK client against a loopback Messages server.

Expected request bodies are written out by hand from the Messages API documentation (the
independent reference); costs are computed by hand from the list prices. Float costs are compared
with rel=1e-12: a few additions of exact decimal products, so only rounding can differ.
"""

import json
import traceback

import pytest

from harness.agents import ChatAgent, make_agent
from harness.protocol import AgentError, AgentTurn, Message, ToolResult, ToolSpec
from tests.loopback import anthropic_wire as aw

__all__: list[str] = []

ANTHROPIC_TEST_KEY = "sk-ant-test-0123456789-SECRET"
MODEL = "claude-opus-5"
TOOLS = [
    ToolSpec(
        "read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    ),
    ToolSpec("shell", "Run a command", {"type": "object", "properties": {"cmd": {"type": "string"}}}),
]


@pytest.fixture
def server():
    with aw.anthropic_server() as srv:
        yield srv


def agent_for(server, model: str = MODEL, **options):
    options.setdefault("max_retries", 2)
    return make_agent(f"anthropic:{model}", api_key=ANTHROPIC_TEST_KEY, base_url=server.url, **options)


def count_cache_marks(value) -> int:
    if isinstance(value, dict):
        return int("cache_control" in value) + sum(count_cache_marks(v) for v in value.values())
    if isinstance(value, list):
        return sum(count_cache_marks(v) for v in value)
    return 0


def test_two_turn_tool_conversation_round_trips_ids_and_order(server):
    server.enqueue(
        aw.reply(
            aw.message(
                aw.text("Reading both."),
                aw.tool_use("toolu_A1", "read", {"path": "a.py"}),
                aw.tool_use("toolu_B2", "shell", {"cmd": "ls"}),
                stop_reason="tool_use",
            )
        ),
        aw.reply(aw.message(aw.text("Both done."))),
    )
    agent = agent_for(server)
    assert isinstance(agent, ChatAgent) and agent.name == "anthropic:claude-opus-5"
    conversation = [Message(role="user", text="Fix the bug.")]

    first = agent.step("You are careful.", conversation, TOOLS, 256)
    assert first.stop_reason == "tool_use"
    assert first.text == "Reading both."
    assert [(c.id, c.name, c.arguments, c.parse_error) for c in first.tool_calls] == [
        ("toolu_A1", "read", {"path": "a.py"}, ""),
        ("toolu_B2", "shell", {"cmd": "ls"}, ""),
    ]

    conversation += [
        Message(role="assistant", turn=first),
        Message(
            role="tool",
            results=(ToolResult("toolu_A1", "print(1)"), ToolResult("toolu_B2", "exit 2", is_error=True)),
        ),
        Message(role="user", text="Gate feedback: 1 test failed."),
    ]
    second = agent.step("You are careful.", conversation, TOOLS, 256)
    assert second.text == "Both done." and second.stop_reason == "end_turn" and second.tool_calls == ()

    body = server.posts()[1].body
    assert body["model"] == MODEL and body["max_tokens"] == 256
    # Tool results go back in one user message, in call order, before the harness's own text.
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "toolu_A1", "name": "read", "input": {"path": "a.py"}},
                {"type": "tool_use", "id": "toolu_B2", "name": "shell", "input": {"cmd": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_A1", "content": "print(1)", "is_error": False},
                {"type": "tool_result", "tool_use_id": "toolu_B2", "content": "exit 2", "is_error": True},
                {
                    "type": "text",
                    "text": "Gate feedback: 1 test failed.",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
    ]
    assert server.posts()[1].headers["authorization"] == f"Bearer {ANTHROPIC_TEST_KEY}"


def test_cache_control_on_stable_prefix_and_moving_last_message(server):
    server.enqueue(
        aw.reply(aw.message(aw.tool_use("toolu_1", "read", {"path": "x"}), stop_reason="tool_use")),
        aw.reply(aw.message(aw.text("ok"))),
    )
    agent = agent_for(server)
    conversation = [Message(role="user", text="go")]
    turn = agent.step("SYSTEM PROMPT", conversation, TOOLS, 64)
    conversation += [
        Message(role="assistant", turn=turn),
        Message(role="tool", results=(ToolResult("toolu_1", "data"),)),
    ]
    agent.step("SYSTEM PROMPT", conversation, TOOLS, 64)

    first, second = (r.body for r in server.posts())
    for body in (first, second):
        assert body["system"] == [{"type": "text", "text": "SYSTEM PROMPT", "cache_control": {"type": "ephemeral"}}]
        assert "cache_control" not in body["tools"][0]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        assert count_cache_marks(body) == 3  # the API allows 4 breakpoints per request
    # The breakpoint moved on: the first request's last block is sent unmarked the second time.
    assert second["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "go"}]}

    server.enqueue(aw.reply(aw.message(aw.text("no cache"))))
    agent_for(server, prompt_caching=False).step("SYSTEM PROMPT", conversation, TOOLS, 64)
    assert count_cache_marks(server.posts()[-1].body) == 0


def test_usage_and_cost_of_a_priced_model(server):
    tokens = aw.usage(input_tokens=1000, output_tokens=200, cache_write=3000, cache_read=50_000)
    server.enqueue(aw.reply(aw.message(aw.text("hi"), model="claude-opus-5", tokens=tokens)))
    turn = agent_for(server).step("s", [Message(role="user", text="hi")], [], 64)
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (1000, 200)
    assert (turn.usage.cache_write_tokens, turn.usage.cache_read_tokens) == (3000, 50_000)
    # Opus 5 list prices per MTok: input 5, output 25, 5-minute cache write 6.25, cache read 0.50.
    expected = (1000 * 5 + 200 * 25 + 3000 * 6.25 + 50_000 * 0.50) / 1e6
    assert turn.usage.cost_usd == pytest.approx(expected, rel=1e-12)
    assert turn.model == "claude-opus-5"


def test_unknown_model_reports_tokens_and_no_cost(server):
    server.enqueue(aw.reply(aw.message(aw.text("hi"), model="claude-prototype-9", tokens=aw.usage(7, 3))))
    turn = agent_for(server, model="claude-prototype-9").step("s", [Message(role="user", text="hi")], [], 64)
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (7, 3)
    assert turn.usage.cost_usd is None


def test_429_retry_after_is_honoured(server):
    # The server keeps answering 429 until a full second has passed, like a real rate limiter.
    # The SDK's own first backoff is at most 0.5 s, so a client ignoring retry-after would come
    # back early and cost a third request.
    server.enqueue(aw.rate_limited("1", hold_s=1.0), aw.reply(aw.message(aw.text("after the wait"))))
    turn = agent_for(server).step("s", [Message(role="user", text="hi")], [], 64)
    assert turn.text == "after the wait"
    posts = server.posts()
    assert len(posts) == 2
    assert not any(r.early for r in posts)
    assert posts[1].headers["x-stainless-retry-count"] == "1"


def test_500_is_retried_then_succeeds(server):
    server.enqueue(
        aw.error(500, "api_error", "Internal server error", {"retry-after-ms": "10"}),
        aw.error(529, "overloaded_error", "Overloaded", {"retry-after-ms": "10"}),
        aw.reply(aw.message(aw.text("recovered"))),
    )
    turn = agent_for(server).step("s", [Message(role="user", text="hi")], [], 64)
    assert turn.text == "recovered"
    assert len(server.posts()) == 3


def test_5xx_beyond_retries_is_an_agent_error(server):
    server.enqueue(*[aw.error(500, "api_error", "down", {"retry-after-ms": "5"}) for _ in range(3)])
    with pytest.raises(AgentError, match="HTTP 500 api_error: down .*after 2 retries"):
        agent_for(server).step("s", [Message(role="user", text="hi")], [], 64)
    assert len(server.posts()) == 3


def test_401_is_not_retried_and_never_shows_the_key(server):
    # Worst case: a proxy that echoes the key it was given in its error message.
    server.enqueue(aw.error(401, "authentication_error", f"invalid x-api-key {ANTHROPIC_TEST_KEY}"))
    with pytest.raises(AgentError) as caught:
        agent_for(server).step("s", [Message(role="user", text="hi")], [], 64)
    message = str(caught.value)
    assert "HTTP 401 authentication_error" in message and "ANTHROPIC_API_KEY" in message
    assert ANTHROPIC_TEST_KEY not in message and ANTHROPIC_TEST_KEY not in repr(caught.value)
    assert ANTHROPIC_TEST_KEY not in "".join(traceback.format_exception(caught.value))
    assert len(server.posts()) == 1


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AgentError, match="ANTHROPIC_API_KEY"):
        make_agent("anthropic:claude-opus-5")


def test_key_and_base_url_come_from_settings(server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.enqueue(aw.reply(aw.message(aw.text("env"))))
    agent = make_agent("anthropic:claude-opus-5")
    assert agent.step("s", [Message(role="user", text="hi")], [], 8).text == "env"
    assert server.posts()[0].headers["authorization"] == "Bearer sk-ant-from-env"
    assert "sk-ant-from-env" not in repr(agent)


def test_malformed_tool_input_becomes_parse_error(server):
    server.enqueue(
        aw.reply(
            aw.message(
                aw.tool_use("toolu_bad", "read", '{"path": "a.py"'),
                aw.tool_use("toolu_str", "read", '{"path": "b.py"}'),
                aw.tool_use("toolu_list", "read", ["a.py"]),
                stop_reason="tool_use",
            )
        ),
        aw.reply(aw.message(aw.text("ok"))),
    )
    agent = agent_for(server)
    turn = agent.step("s", [Message(role="user", text="go")], TOOLS, 64)
    bad, as_string, as_list = turn.tool_calls
    assert bad.arguments == {} and "not valid JSON" in bad.parse_error and bad.raw_arguments == '{"path": "a.py"'
    assert as_string.arguments == {"path": "b.py"} and as_string.parse_error == ""
    assert as_list.arguments == {} and "JSON object" in as_list.parse_error

    results = tuple(ToolResult(c.id, c.parse_error or "ok", is_error=bool(c.parse_error)) for c in turn.tool_calls)
    agent.step(
        "s",
        [Message(role="user", text="go"), Message(role="assistant", turn=turn), Message(role="tool", results=results)],
        TOOLS,
        64,
    )
    sent = server.posts()[1].body["messages"][1]["content"]
    # The API requires an object: broken inputs go back as {} next to the error result.
    assert [b["input"] for b in sent] == [{}, {"path": "b.py"}, {}]


@pytest.mark.parametrize(
    ("wire", "neutral"),
    [
        ("max_tokens", "max_tokens"),
        ("pause_turn", "pause_turn"),
        ("refusal", "refusal"),
        ("end_turn", "end_turn"),
        ("stop_sequence", "end_turn"),
        ("model_context_window_exceeded", "max_tokens"),
    ],
)
def test_stop_reasons(server, wire, neutral):
    server.enqueue(aw.reply(aw.message(aw.text("partial"), stop_reason=wire)))
    turn = agent_for(server).step("s", [Message(role="user", text="go")], [], 16)
    assert turn.stop_reason == neutral and turn.text == "partial"


def test_thinking_blocks_go_back_verbatim(server):
    server.enqueue(
        aw.reply(
            aw.message(
                aw.thinking("Let me read it first.", signature="EqQBCkYIBxgCKkD-opaque"),
                aw.text("Reading."),
                aw.tool_use("toolu_T", "read", {"path": "a.py"}),
                stop_reason="tool_use",
            )
        ),
        aw.reply(aw.message(aw.text("done"))),
    )
    agent = agent_for(server)
    turn = agent.step("s", [Message(role="user", text="go")], TOOLS, 64)
    assert turn.text == "Reading." and [c.id for c in turn.tool_calls] == ["toolu_T"]
    # A record round trip (JSON) must keep what the next call needs.
    restored = AgentTurn.from_json(json.loads(json.dumps(turn.to_json())))
    assert restored == turn
    conversation = [
        Message(role="user", text="go"),
        Message(role="assistant", turn=restored),
        Message(role="tool", results=(ToolResult("toolu_T", "x = 1"),)),
    ]
    agent.step("s", conversation, TOOLS, 64)
    assert server.posts()[1].body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Let me read it first.", "signature": "EqQBCkYIBxgCKkD-opaque"},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "toolu_T", "name": "read", "input": {"path": "a.py"}},
    ]


def test_empty_turns_are_not_sent(server):
    server.enqueue(aw.reply(aw.message(aw.text("ok"))))
    conversation = [
        Message(role="user", text="go"),
        Message(role="assistant", turn=AgentTurn(text="", stop_reason="max_tokens")),
        Message(role="user", text="continue"),
    ]
    agent_for(server).step("", conversation, [], 16)
    body = server.posts()[0].body
    assert "system" not in body and "tools" not in body
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "go"},
                {"type": "text", "text": "continue", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]


def test_unreachable_server_is_an_agent_error(server):
    closed = agent_for(server, max_retries=0)
    server.__exit__(None, None, None)  # nothing listens on that port any more
    with pytest.raises(AgentError, match="could not connect"):
        closed.step("s", [Message(role="user", text="hi")], [], 8)


def test_pause_turn_is_continued_from_the_assistant_message(server):
    server.enqueue(
        aw.reply(aw.message(aw.text("Searching the docs"), stop_reason="pause_turn")),
        aw.reply(aw.message(aw.text(" and found it."))),
    )
    agent = agent_for(server)
    conversation = [Message(role="user", text="look it up")]
    paused = agent.step("s", conversation, [], 64)
    assert paused.stop_reason == "pause_turn"
    agent.step("s", conversation + [Message(role="assistant", turn=paused)], [], 64)
    # Ending on the assistant's partial turn is how the API resumes it.
    assert server.posts()[1].body["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Searching the docs", "cache_control": {"type": "ephemeral"}}],
    }


def test_large_max_tokens_is_sent_without_streaming(server):
    # On its default timeout the SDK refuses non-streaming calls it expects to exceed 10 minutes
    # (here: 64k tokens, and a model it caps at 8192); the backend's explicit timeout avoids that.
    server.enqueue(aw.reply(aw.message(aw.text("long"))))
    turn = agent_for(server, model="claude-opus-4-1").step("s", [Message(role="user", text="hi")], [], 64_000)
    assert turn.text == "long" and server.posts()[0].body["max_tokens"] == 64_000
