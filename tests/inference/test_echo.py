"""The built-in echo provider, and the README's first streaming request against it."""

from __future__ import annotations

import shutil
import subprocess

import openai
import orjson
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_streams_tokens_from_echo(gw, key):
    # The README's command, against this test's gateway.
    done = subprocess.run(
        [
            "curl", "-sN", f"{gw.url}/v1/chat/completions",
            "-H", f"Authorization: Bearer {key}",
            "-H", "Content-Type: application/json",
            "-d", '{"model": "echo-1", "stream": true, '
            '"messages": [{"role": "user", "content": "Hello from the gateway"}]}',
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [orjson.loads(line[6:]) for line in lines[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert [p for p in pieces if p] == ["Hello ", "from ", "the ", "gateway"]


def test_echo_counts_tokens(client):
    prompt = "ünïcode counts by bytes"
    done = client.chat.completions.create(
        model="echo-1",
        messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": prompt}],
    )
    assert done.choices[0].message.content == prompt
    assert done.usage.prompt_tokens == estimate_tokens("Be kind.\n" + prompt)
    assert done.usage.completion_tokens == estimate_tokens(prompt)


def test_echo_stops_at_the_output_limit(client):
    done = client.chat.completions.create(
        model="echo-1", messages=[{"role": "user", "content": "one two three four five six"}],
        max_tokens=2,
    )  # fmt: skip
    assert done.choices[0].finish_reason == "length"
    assert done.choices[0].message.content == "one two "
    assert done.usage.completion_tokens == 2


def test_echo_calls_a_forced_tool_and_reads_its_result(client):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    asked = [{"role": "user", "content": "find it"}]
    done = client.chat.completions.create(
        model="echo-1", messages=asked, tools=[tool], tool_choice="required"
    )
    [call] = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, orjson.loads(call.function.arguments)) == (
        "lookup",
        {"text": "find it"},
    )
    answered = client.chat.completions.create(
        model="echo-1",
        messages=[
            *asked,
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "found"},
        ],
        tools=[tool],
    )
    assert answered.choices[0].message.content == "found"


def test_echo_keeps_a_forced_tool_calls_arguments_within_the_output_limit(client):
    """Its arguments echo the prompt: cut at the limit, as a model's would be, so that the
    answer stays within what the request holds (not a 502 past the held output)."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    asked = [{"role": "user", "content": "find " + "it " * 500}]
    done = client.chat.completions.create(
        model="echo-1", messages=asked, tools=[tool], tool_choice="required", max_tokens=8
    )
    [call] = done.choices[0].message.tool_calls
    assert orjson.loads(call.function.arguments)["text"].startswith("find it")
    assert done.usage.completion_tokens <= 8


def test_echo_tools_need_a_model_with_tools(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="echo-notools",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert caught.value.body["param"] == "tools"
