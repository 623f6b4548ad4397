"""The official `anthropic` SDK, unchanged, against /v1/messages: plain, streamed, tools
and a tool result's turn, count_tokens; on the echo model, an OpenAI-compatible upstream
(translated both ways) and an Anthropic upstream (passed through), and with what Claude
Code sends (the key as a bearer token, anthropic-beta, anthropic-version, a vendor model
name that is an alias)."""

from __future__ import annotations

import anthropic
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens, messages_prompt_text
from tests.support.fake_anthropic import COUNTED_TOKENS
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, REPLY
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, UPSTREAM_ENV, _model, inference_config

PROMPT = "Say something, please."
MODELS = ["echo-1", "oa/normal", "an/normal"]
TOOL_MODELS = {"echo-1": "echo-1", "oa/normal": "oa/tool-call", "an/normal": "an/tool-call"}
# Vendor names Claude Code sends, each an alias of a model of this gateway.
ALIASES = {
    "claude-sonnet-4-5-20250929": ("sonnet", "fakeanthropic"),
    "claude-haiku-4-5-20251001": ("haiku", "fakeai"),
}
BETA = "claude-code-20250219,interleaved-thinking-2025-05-14"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _config(openai_url: str, anthropic_url: str) -> str:
    config = inference_config(openai_url, anthropic_url) + NO_BREAKER
    for alias, (model_id, provider) in ALIASES.items():
        config += _model(model_id, provider, "normal") + f'aliases = ["{alias}"]\n'
    return config


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake_openai, fake_anthropic):
    folder = tmp_path_factory.mktemp("messages-sdk")
    config = _config(fake_openai.url, fake_anthropic.url)
    with GatewayProcess(folder, extra_config=config, env=UPSTREAM_ENV) as process:
        yield process


@pytest.fixture(scope="module")
def key(gw) -> str:
    return gw.create_key(gw.create_project("messages", "--balance", "100"), "inference")


@pytest.fixture(scope="module")
def client(gw, key) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def claude_code(gw, key) -> anthropic.Anthropic:
    """The SDK as Claude Code sets it up: the key as a bearer token, and its betas."""
    return anthropic.Anthropic(
        base_url=gw.url,
        auth_token=key,
        default_headers={"anthropic-beta": BETA, "anthropic-version": "2023-06-01"},
        max_retries=0,
        timeout=20,
    )


def expected(model: str) -> str:
    return PROMPT if model == "echo-1" else REPLY


def expected_usage(model: str) -> tuple[int, int]:
    if model == "echo-1":
        return estimate_tokens(PROMPT), estimate_tokens(PROMPT)
    return INPUT_TOKENS, OUTPUT_TOKENS


def _ask(text: str = PROMPT) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("model", MODELS)
def test_create(client, model):
    message = client.messages.create(model=model, max_tokens=200, messages=_ask())
    assert message.type == "message" and message.role == "assistant"
    assert message.model == model
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == expected(model)
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == expected_usage(model)


@pytest.mark.parametrize("model", MODELS)
def test_stream(client, model):
    with client.messages.stream(model=model, max_tokens=200, messages=_ask()) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == expected(model)
    assert len(pieces) > 1, "the answer came in one piece: not streamed"
    assert final.model == model
    assert final.content[0].text == expected(model)
    assert final.stop_reason == "end_turn"
    # A translated stream's final message_delta carries the whole usage, input included.
    assert (final.usage.input_tokens, final.usage.output_tokens) == expected_usage(model)


def test_a_translated_stream_bills_its_whole_prompt_system_included(client):
    with client.messages.stream(
        model="echo-1", max_tokens=200, messages=_ask(), system="Be brief."
    ) as stream:
        final = stream.get_final_message()
    prompt = "Be brief.\n" + PROMPT  # what the echo counts: every message's text
    assert final.usage.input_tokens == estimate_tokens(prompt)
    assert final.usage.output_tokens == estimate_tokens(PROMPT)


def _tool_turns(client, model: str, *, stream: bool) -> tuple:
    """A call of the tool, then the answer to its result: both messages."""
    asked = {
        "model": TOOL_MODELS[model],
        "max_tokens": 200,
        "messages": _ask(),
        "tools": [WEATHER],
        "tool_choice": {"type": "any"},
    }
    if stream:
        with client.messages.stream(**asked) as events:
            called = events.get_final_message()
    else:
        called = client.messages.create(**asked)
    [use] = [block for block in called.content if block.type == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}
    turns = [
        *asked["messages"],
        {"role": "assistant", "content": called.content},
        {"role": "user", "content": [result]},
    ]
    answered = client.messages.create(
        **{**asked, "messages": turns, "tool_choice": {"type": "auto"}}
    )
    return called, use, answered


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_tool_use_then_tool_result(client, model, stream):
    called, use, answered = _tool_turns(client, model, stream=stream)
    assert called.stop_reason == "tool_use"
    assert called.model == TOOL_MODELS[model]
    assert use.name == "get_weather" and use.id
    assert use.input == ({"text": PROMPT} if model == "echo-1" else {"city": "Paris"})
    assert answered.stop_reason == "end_turn"
    said = answered.content[0].text
    assert said == ("Sunny" if model == "echo-1" else "The tool said: Sunny")


@pytest.mark.parametrize("model", MODELS)
def test_count_tokens(client, model):
    asked = {"model": model, "messages": _ask(), "system": "Be brief.", "tools": [WEATHER]}
    counted = client.messages.count_tokens(**asked)
    if model == "an/normal":
        assert counted.input_tokens == COUNTED_TOKENS  # the upstream's own count
    else:
        assert counted.input_tokens == estimate_tokens(messages_prompt_text(asked))


def test_count_tokens_asks_the_anthropic_upstream(client, fake_anthropic):
    client.messages.count_tokens(model="an/normal", messages=_ask("marker-count-5e1"))
    [sent] = fake_anthropic.sent(marker="marker-count-5e1")
    assert sent.path == "/v1/messages/count_tokens"
    assert sent.body == {"model": "normal", "messages": _ask("marker-count-5e1")}


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("alias", ALIASES)
def test_claude_code_headers_and_alias(claude_code, fake_anthropic, fake_openai, alias):
    model_id, provider = ALIASES[alias]
    marker = f"marker-claude-code-{model_id}"
    message = claude_code.messages.create(model=alias, max_tokens=100, messages=_ask(marker))
    assert message.model == alias  # named as asked
    assert message.content[0].text == REPLY
    with claude_code.messages.stream(model=alias, max_tokens=100, messages=_ask(marker)) as stream:
        assert "".join(stream.text_stream) == REPLY
        assert stream.get_final_message().model == alias
    fake = fake_anthropic if provider == "fakeanthropic" else fake_openai
    sent = fake.sent(marker=marker)
    assert len(sent) == 2 and all(r.body["model"] == "normal" for r in sent)
    if provider == "fakeanthropic":  # forwarded to Anthropic upstreams only
        assert all(r.headers["anthropic-beta"] == BETA for r in sent)
    else:
        assert not any("anthropic-beta" in r.headers for r in sent)
    counted = claude_code.messages.count_tokens(model=alias, messages=_ask(marker))
    assert counted.input_tokens == (
        COUNTED_TOKENS if provider == "fakeanthropic" else estimate_tokens(marker)
    )
