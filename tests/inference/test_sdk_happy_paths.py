"""The official openai SDK against every provider kind: chat and Responses, plain and
streaming. `oa` has a native Responses endpoint, `oa-chat` has none (translated), `an`
is Anthropic (translated both ways), echo-1 is the built-in provider."""

from __future__ import annotations

import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, REPLY

PROMPT = "Say something, please."
MODELS = ["echo-1", "oa/normal", "oa-chat/normal", "an/normal"]


def expected(model: str) -> str:
    return PROMPT if model == "echo-1" else REPLY


def expected_usage(model: str, prompt_text: str = PROMPT) -> tuple[int, int]:
    if model == "echo-1":
        return estimate_tokens(prompt_text), estimate_tokens(PROMPT)
    return INPUT_TOKENS, OUTPUT_TOKENS


@pytest.mark.parametrize("model", MODELS)
def test_chat_completion(client, model):
    done = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}]
    )
    assert done.object == "chat.completion"
    assert done.model == model
    assert done.choices[0].message.role == "assistant"
    assert done.choices[0].message.content == expected(model)
    assert done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == expected_usage(model)


@pytest.mark.parametrize("model", MODELS)
def test_chat_completion_stream(client, model):
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert "".join(deltas) == expected(model)
    assert len(deltas) > 1, "the answer came in one piece: not streamed"
    assert all(c.model == model and c.object == "chat.completion.chunk" for c in chunks)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == expected_usage(model)


@pytest.mark.parametrize("model", MODELS)
def test_responses(client, model):
    response = client.responses.create(model=model, input=PROMPT)
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.model == model
    assert response.status == "completed"
    assert response.output_text == expected(model)
    assert response.output[0].type == "message"
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == expected_usage(model)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream_events(client, model):
    events = list(client.responses.create(model=model, input=PROMPT, stream=True))
    names = [e.type for e in events]
    assert names[0] == "response.created"
    assert names[-1] == "response.completed"
    for name in (
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert name in names
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == expected(model)
    assert len(deltas) > 1
    final = events[-1].response
    assert final.model == model and final.status == "completed"
    assert final.output_text == expected(model)
    assert (final.usage.input_tokens, final.usage.output_tokens) == expected_usage(model)


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream_helper_accumulates(client, model):
    """The SDK's strict stream helper checks item identities and ordering on the way."""
    with client.responses.stream(model=model, input=PROMPT, instructions="Be brief.") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == expected(model)
    assert final.output_text == expected(model)


def test_native_responses_pass_through_and_others_translate(client, fake_openai):
    client.responses.create(model="oa/normal", input="marker-native-7a1")
    client.responses.create(model="oa-chat/normal", input="marker-translated-7a1")
    [native] = fake_openai.sent(marker="marker-native-7a1")
    assert native.path == "/v1/responses"
    assert native.body["input"] == "marker-native-7a1"
    [translated] = fake_openai.sent(marker="marker-translated-7a1")
    assert translated.path == "/chatonly/v1/chat/completions"
    assert translated.body["messages"] == [{"role": "user", "content": "marker-translated-7a1"}]
