"""The OpenAI backends end to end: the real `openai` SDK client against a loopback Chat Completions
server, as `openai:<model>` and as `openai-compatible:<base_url>#<model>` (vLLM / SGLang / Ollama).

Expected request bodies are written out by hand from the Chat Completions reference; costs by hand
from the list prices (rel=1e-12: a few additions of exact decimal products).
"""

import traceback

import pytest

from harness.agents import ChatAgent, make_agent
from harness.protocol import AgentError, Message, ToolResult, ToolSpec
from tests.loopback import openai_wire as ow

__all__: list[str] = []

OPENAI_TEST_KEY = "sk-proj-test-0123456789-SECRET"
TOOLS = [ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})]


@pytest.fixture
def server():
    with ow.openai_server() as srv:
        yield srv


def agent_for(server, model: str = "gpt-4.1", **options):
    options.setdefault("max_retries", 2)
    return make_agent(f"openai:{model}", api_key=OPENAI_TEST_KEY, base_url=server.url + "/v1", **options)


def test_two_turn_tool_conversation(server):
    server.enqueue(
        ow.completion(
            "Reading.",
            tool_calls=[
                ow.tool_call("call_1", "read", {"path": "a.py"}),
                ow.tool_call("call_2", "read", {"path": "b.py"}),
            ],
            finish_reason="tool_calls",
        ),
        ow.completion("Done."),
    )
    agent = agent_for(server)
    assert isinstance(agent, ChatAgent) and agent.name == "openai:gpt-4.1"
    conversation = [Message(role="user", text="Fix it.")]
    first = agent.step("Be careful.", conversation, TOOLS, 300)
    assert first.stop_reason == "tool_use" and first.text == "Reading."
    assert [(c.id, c.name, c.arguments, c.parse_error) for c in first.tool_calls] == [
        ("call_1", "read", {"path": "a.py"}, ""),
        ("call_2", "read", {"path": "b.py"}, ""),
    ]
    conversation += [
        Message(role="assistant", turn=first),
        Message(role="tool", results=(ToolResult("call_1", "A"), ToolResult("call_2", "no such file", is_error=True))),
    ]
    second = agent.step("Be careful.", conversation, TOOLS, 300)
    assert second.text == "Done." and second.stop_reason == "end_turn"

    body = server.posts()[1].body
    assert body["model"] == "gpt-4.1" and body["max_completion_tokens"] == 300 and "max_tokens" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "read", "description": "Read a file", "parameters": TOOLS[0].parameters},
        }
    ]
    assert body["messages"] == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}},
                {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": '{"path": "b.py"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ERROR: no such file"},
    ]
    assert server.posts()[0].headers["authorization"] == f"Bearer {OPENAI_TEST_KEY}"


def test_malformed_arguments_become_parse_errors(server):
    server.enqueue(
        ow.completion(
            None,
            tool_calls=[
                ow.tool_call("call_bad", "read", '{"path": "a.py", '),
                ow.tool_call("call_list", "read", "[1, 2]"),
                ow.tool_call("call_empty", "read", ""),
            ],
            finish_reason="tool_calls",
        ),
        ow.completion("ok"),
    )
    agent = agent_for(server)
    turn = agent.step("", [Message(role="user", text="go")], TOOLS, 50)
    bad, as_list, empty = turn.tool_calls
    assert bad.arguments == {} and "not valid JSON" in bad.parse_error and bad.raw_arguments == '{"path": "a.py", '
    assert as_list.arguments == {} and "JSON object" in as_list.parse_error
    assert empty.arguments == {} and empty.parse_error == ""
    assert turn.text == ""

    results = tuple(ToolResult(c.id, c.parse_error or "ok", is_error=bool(c.parse_error)) for c in turn.tool_calls)
    agent.step(
        "",
        [Message(role="user", text="go"), Message(role="assistant", turn=turn), Message(role="tool", results=results)],
        TOOLS,
        50,
    )
    sent = server.posts()[1].body["messages"][1]
    assert sent["content"] is None
    assert [c["function"]["arguments"] for c in sent["tool_calls"]] == ["{}", "{}", "{}"]


@pytest.mark.parametrize(
    ("finish", "has_calls", "refusal", "neutral"),
    [
        ("length", False, None, "max_tokens"),
        ("content_filter", False, None, "refusal"),
        ("stop", False, None, "end_turn"),
        ("tool_calls", True, None, "tool_use"),
        ("stop", True, None, "tool_use"),  # vLLM / Ollama say "stop" next to tool calls
        ("stop", False, "I can't help with that.", "refusal"),
    ],
)
def test_finish_reasons(server, finish, has_calls, refusal, neutral):
    calls = [ow.tool_call("call_x", "read", {"path": "x"})] if has_calls else None
    server.enqueue(ow.completion(None if refusal else "text", tool_calls=calls, finish_reason=finish, refusal=refusal))
    turn = agent_for(server).step("", [Message(role="user", text="go")], TOOLS, 5)
    assert turn.stop_reason == neutral
    if refusal:
        assert turn.text == refusal


def test_usage_with_cached_tokens_and_cost(server):
    server.enqueue(ow.completion("hi", tokens=ow.usage(prompt=12_000, completion_=500, cached=8_000)))
    turn = agent_for(server).step("", [Message(role="user", text="hi")], [], 600)
    usage = turn.usage
    assert (usage.input_tokens, usage.cache_read_tokens, usage.output_tokens, usage.cache_write_tokens) == (
        4_000,
        8_000,
        500,
        0,
    )
    # gpt-4.1 list prices per MTok: input 2.00, cached input 0.50, output 8.00.
    assert usage.cost_usd == pytest.approx((4_000 * 2.00 + 8_000 * 0.50 + 500 * 8.00) / 1e6, rel=1e-12)


def test_unknown_openai_model_has_no_cost(server):
    server.enqueue(ow.completion("hi", model="gpt-7-preview"))
    turn = agent_for(server, model="gpt-7-preview").step("", [Message(role="user", text="hi")], [], 5)
    assert turn.usage.input_tokens == 20 and turn.usage.cost_usd is None


def test_openai_compatible_server(server, monkeypatch):
    # The real OpenAI key must never travel to a foreign server.
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_TEST_KEY)
    server.enqueue(
        ow.completion(
            None,
            tool_calls=[ow.tool_call("call_0", "read", {"path": "x"})],
            finish_reason="tool_calls",
            model="gpt-4.1",
        )
    )
    spec = f"openai-compatible:{server.url}/v1#gpt-4.1"
    agent = make_agent(spec, max_retries=0)
    assert agent.name == spec
    turn = agent.step("sys", [Message(role="user", text="go")], TOOLS, 42)
    assert turn.tool_calls[0].arguments == {"path": "x"}
    # Same model name as a priced OpenAI model, yet a local server's cost is unknown.
    assert turn.usage.input_tokens == 20 and turn.usage.cost_usd is None
    request = server.posts()[0]
    assert request.headers["authorization"] == "Bearer not-needed"
    assert request.body["max_tokens"] == 42 and "max_completion_tokens" not in request.body


def test_openai_compatible_with_explicit_key(server):
    server.enqueue(ow.error(401, "invalid_request_error", "bad key"))
    agent = make_agent(f"openai-compatible:{server.url}/v1#qwen3-coder", api_key="local-key-SECRET", max_retries=0)
    with pytest.raises(AgentError) as caught:
        agent.step("", [Message(role="user", text="go")], [], 5)
    assert "HTTP 401" in str(caught.value) and "local-key-SECRET" not in str(caught.value)
    assert server.posts()[0].headers["authorization"] == "Bearer local-key-SECRET"


def test_429_retry_after_ms_is_honoured(server):
    # Held for 0.7 s; the SDK's own first backoff is at most 0.5 s, so ignoring retry-after-ms
    # would cost an extra request.
    server.enqueue(ow.rate_limited("700", header="retry-after-ms", hold_s=0.7), ow.completion("waited"))
    assert agent_for(server).step("", [Message(role="user", text="hi")], [], 5).text == "waited"
    posts = server.posts()
    assert len(posts) == 2 and not any(r.early for r in posts)


def test_429_with_retry_after_beyond_sdk_limit_fails_at_once(server):
    # The SDK refuses to sleep more than two minutes: no retry, one request, a clear error.
    server.enqueue(ow.rate_limited("3600", hold_s=0.0))
    with pytest.raises(AgentError, match="HTTP 429"):
        agent_for(server).step("", [Message(role="user", text="hi")], [], 5)
    assert len(server.posts()) == 1


def test_500_is_retried_then_succeeds(server):
    server.enqueue(ow.error(500, "server_error", "boom", {"retry-after-ms": "10"}), ow.completion("fine"))
    assert agent_for(server).step("", [Message(role="user", text="hi")], [], 5).text == "fine"
    assert len(server.posts()) == 2


def test_401_is_an_agent_error_without_the_key(server):
    server.enqueue(ow.error(401, "invalid_request_error", f"Incorrect API key provided: {OPENAI_TEST_KEY}"))
    with pytest.raises(AgentError) as caught:
        agent_for(server).step("", [Message(role="user", text="hi")], [], 5)
    message = str(caught.value)
    assert "HTTP 401" in message and "OPENAI_API_KEY" in message
    assert OPENAI_TEST_KEY not in message and OPENAI_TEST_KEY not in "".join(traceback.format_exception(caught.value))
    assert len(server.posts()) == 1


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AgentError, match="OPENAI_API_KEY"):
        make_agent("openai:gpt-4.1")


def test_key_and_base_url_come_from_settings(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    server.enqueue(ow.completion("env"))
    assert make_agent("openai:gpt-4.1").step("", [Message(role="user", text="hi")], [], 5).text == "env"
    assert server.posts()[0].headers["authorization"] == "Bearer sk-from-env"
