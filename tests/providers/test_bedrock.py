"""`kind = "bedrock"` end to end: a real `gateway serve` in front of the fake Bedrock
Runtime (tests/support/fake_bedrock.py), which verifies every request's Signature V4 as
AWS does and answers Converse and ConverseStream (AWS event-stream frames).

Models are `br/<mode>` (the fake's behaviour, see fake_bedrock), beside providers with a
wrong secret, temporary credentials, an unset variable, botocore's default chain.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from http.client import HTTPConnection

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from model_gateway.gateway.metering.money import cost_of_tokens
from tests.metering.billing import micros
from tests.support.errors import assert_error
from tests.support.fake_bedrock import (
    ACCESS_KEY,
    CACHE_READ,
    CACHE_WRITE,
    REASONING,
    REGION,
    SECRET_KEY,
    SESSION_TOKEN,
    TEMP_ACCESS_KEY,
    TEMP_SECRET_KEY,
    FakeBedrock,
)
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, REPLY, REPLY_PIECES, SECRET
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, sse_payloads

PROMPT = "Say something, please."
INPUT_PRICE, OUTPUT_PRICE = 3_000_000, 15_000_000  # micro-units per million tokens
CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
PROFILE_ARN = f"arn:aws:bedrock:{REGION}:123456789012:inference-profile/us.{CLAUDE}"
MODES = [
    "normal",
    "tool-call",
    "length",
    "cached",
    "fault-400",
    "fault-429",
    "fault-500",
    "fault-424",
    "cut-mid-stream",
    "no-metadata",
    "stream-exception",
    "bad-crc",
    "malformed-shape",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CHAIN_ENV = {  # botocore's default chain finds these (its environment provider)
    "AWS_ACCESS_KEY_ID": TEMP_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": TEMP_SECRET_KEY,
    "AWS_SESSION_TOKEN": SESSION_TOKEN,
}
# Other variables through which the chain could find credentials on the test machine.
CHAIN_SOURCES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _model(model_id: str, provider: str, upstream: str, fallback: str = "") -> str:
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
input_price_per_mtok = "3.00"
output_price_per_mtok = "15.00"
supports_tools = true
max_output_tokens = 4096
{fallback}"""


def _config(fake: FakeBedrock) -> tuple[str, dict[str, str]]:
    config, env = NO_BREAKER, dict(CHAIN_ENV)
    for name, options in (
        ("br", {}),
        ("br-wrong", {"secret": "not/the/secret/the/fake/knows"}),
        ("br-temp", {"temporary": True}),
    ):
        block, variables = fake.provider_config(name, **options)
        config += block
        env |= variables
    config += f"""
[providers.br-unset]
kind = "bedrock"
base_url = "{fake.url}"
region = "{REGION}"
access_key_env = "GATEWAY_TEST_AWS_KEY_NEVER_SET"
secret_key_env = "GATEWAY_TEST_AWS_SECRET_NEVER_SET"

[providers.br-chain]
kind = "bedrock"
base_url = "{fake.url}"
region = "{REGION}"
"""
    config += "".join(_model(f"br/{mode}", "br", mode) for mode in MODES)
    config += _model("br/claude", "br", CLAUDE) + _model("br/profile", "br", PROFILE_ARN)
    config += _model("wrong/normal", "br-wrong", "wrong-alone")
    echo = '\nfallbacks = [{ provider = "local", upstream = "echo-1" }]\n'
    config += _model("wrong/fallback", "br-wrong", "wrong-then-echo", echo)
    config += _model("temp/normal", "br-temp", "temp-probe")
    config += _model("unset/normal", "br-unset", "unset-probe")
    config += _model("chain/normal", "br-chain", "chain-probe")
    return config, env


@pytest.fixture(scope="module")
def fake():
    with FakeBedrock() as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fake):
    config, env = _config(fake)
    folder = tmp_path_factory.mktemp("bedrock")
    with GatewayProcess(folder, extra_config=config, env=env) as process:
        yield process


def _chat(model: str, stream: bool = False, **extra) -> dict:
    messages = [{"role": "user", "content": PROMPT}]
    return {"model": model, "messages": messages, "stream": stream, **extra}


def _sent(fake: FakeBedrock, marker: str):
    """The one request that reached the fake with `marker` in its body."""
    [request] = [r for r in fake.requests if marker in json.dumps(r.body)]
    return request


def _stream_text(raw: bytes) -> str:
    chunks = [p for p in sse_payloads(raw) if isinstance(p, dict) and p.get("choices")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def _in_band_error(response: httpx.Response) -> dict:
    """A chat stream that opened, then ended with one error event (nothing after it)."""
    assert response.status_code == 200
    payloads = sse_payloads(response.content)
    assert "[DONE]" not in payloads
    errors = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors == [payloads[-1]]
    assert SECRET not in response.text
    return errors[0]["error"]


# --- chat, plain and streamed, with the official SDK ---------------------------------------


def test_chat(client, fake):
    done = client.chat.completions.create(
        model="br/normal",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "marker-plain-31c " + PROMPT},
        ],
        max_tokens=100,
        temperature=0.5,
        stop=["END"],
    )
    assert done.model == "br/normal"
    assert done.choices[0].message.content == REPLY
    assert done.choices[0].finish_reason == "stop"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    sent = _sent(fake, "marker-plain-31c")
    assert sent.path == "/model/normal/converse"
    assert sent.body == {
        "messages": [{"role": "user", "content": [{"text": "marker-plain-31c " + PROMPT}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 100, "temperature": 0.5, "stopSequences": ["END"]},
    }
    authorization = sent.headers["authorization"]
    assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")
    assert f"/{REGION}/bedrock/aws4_request" in authorization
    assert "x-amz-security-token" not in sent.headers


def test_chat_stream(client, fake):
    chunks = list(
        client.chat.completions.create(
            model="br/normal",
            messages=[{"role": "user", "content": "marker-stream-8e1 " + PROMPT}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert deltas == REPLY_PIECES  # piece by piece, as the frames came
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)
    assert _sent(fake, "marker-stream-8e1").path == "/model/normal/converse-stream"


@pytest.mark.parametrize(
    ("model", "upstream"), [("br/claude", CLAUDE), ("br/profile", PROFILE_ARN)]
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_model_ids_with_colons_and_arns_are_signed_as_sent(http, fake, model, upstream, stream):
    """The id is one path segment ('/' encoded); the fake recomputes the signature over
    the path as it arrived, so a request signed over another form of it (':' signed as
    %3A but sent as ':', as aiohttp sends it) is refused."""
    marker = f"marker-id-{stream}-{model}"
    body = _chat(model, stream)
    body["messages"][0]["content"] = marker
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    text = (
        _stream_text(response.content)
        if stream
        else response.json()["choices"][0]["message"]["content"]
    )
    assert text == REPLY
    operation = "converse-stream" if stream else "converse"
    assert _sent(fake, marker).path == f"/model/{upstream}/{operation}"  # as decoded


# --- tools ---------------------------------------------------------------------------------


def test_tool_call_then_result_turn(client, fake):
    first = client.chat.completions.create(
        model="br/tool-call",
        messages=[{"role": "user", "content": "marker-tools-1 Weather in Paris?"}],
        tools=[WEATHER],
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert (call.id, call.function.name) == ("tooluse_fake1", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    sent = _sent(fake, "marker-tools-1")
    spec = WEATHER["function"]
    assert sent.body["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": spec["description"],
                    "inputSchema": {"json": spec["parameters"]},
                }
            }
        ]
    }
    second = client.chat.completions.create(
        model="br/tool-call",
        messages=[
            {"role": "user", "content": "marker-tools-2 Weather in Paris?"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny"},
        ],
        tools=[WEATHER],
    )
    assert second.choices[0].message.content == "The tool said: Sunny"
    assert second.choices[0].finish_reason == "stop"
    messages = _sent(fake, "marker-tools-2").body["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"text": "Let me check."},
            {
                "toolUse": {
                    "toolUseId": "tooluse_fake1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            },
        ],
    }
    result = {"toolUseId": "tooluse_fake1", "content": [{"text": "Sunny"}]}
    assert messages[2] == {"role": "user", "content": [{"toolResult": result}]}


def test_streamed_tool_call(client):
    chunks = list(
        client.chat.completions.create(
            model="br/tool-call",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            stream=True,
        )
    )
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or ())]
    assert calls[0].id == "tooluse_fake1" and calls[0].function.name == "get_weather"
    assert {call.index for call in calls} == {0}
    arguments = "".join(call.function.arguments or "" for call in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert len([c for c in calls if c.function.arguments]) == 2  # as the deltas came
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("required", {"any": {}}),
        ("auto", {"auto": {}}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"tool": {"name": "get_weather"}},
        ),
        ("none", None),
    ],
)
def test_tool_choice(http, fake, choice, expected):
    marker = "marker-choice-" + re.sub(r"\W", "", str(choice))
    body = _chat("br/normal", tools=[WEATHER], tool_choice=choice)
    body["messages"][0]["content"] = marker
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    config = _sent(fake, marker).body.get("toolConfig")
    assert (config or {}).get("toolChoice") == expected
    assert (config is None) == (choice == "none")  # "none": the tools are left out


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
                ],
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                ],
            },
            "messages.1.content.1",
        ),
    ],
    ids=["arguments-not-an-object", "image-part"],
)
def test_what_converse_cannot_take_is_400_with_its_param(http, fake, message, param):
    before = len(fake.requests)
    body = _chat("br/normal")
    body["messages"].append(message)
    assert_error(http.post("/v1/chat/completions", json=body), 400, "invalid_request", param=param)
    assert len(fake.requests) == before


# --- Responses API (translated through chat) -----------------------------------------------


def test_responses(client):
    response = client.responses.create(model="br/normal", input=PROMPT)
    assert response.status == "completed"
    assert response.model == "br/normal"
    assert response.output_text == REPLY
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        INPUT_TOKENS,
        OUTPUT_TOKENS,
    )


def test_responses_stream(client):
    events = list(client.responses.create(model="br/normal", input=PROMPT, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == REPLY_PIECES
    final = events[-1].response
    assert final.output_text == REPLY
    assert (final.usage.input_tokens, final.usage.output_tokens) == (INPUT_TOKENS, OUTPUT_TOKENS)


# --- usage and cost ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_usage_by_class_and_the_receipt_cost(http, stream):
    options = {"stream_options": {"include_usage": True}} if stream else {}
    response = http.post("/v1/chat/completions", json=_chat("br/cached", stream, **options))
    assert response.status_code == 200, response.text
    if stream:
        text = _stream_text(response.content)
        usage = sse_payloads(response.content)[-2]["usage"]  # before [DONE]
    else:
        text = response.json()["choices"][0]["message"]["content"]
        usage = response.json()["usage"]
    assert text == REPLY
    assert REASONING not in response.text  # reasoning is counted in the output, not shown
    assert usage["prompt_tokens"] == INPUT_TOKENS  # all input: cache reads and writes in it
    assert usage["completion_tokens"] == OUTPUT_TOKENS
    details = usage["prompt_tokens_details"]
    assert (details["cached_tokens"], details["cache_write_tokens"]) == (CACHE_READ, CACHE_WRITE)
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded"
    assert receipt["usage"]["input_tokens"] == INPUT_TOKENS
    assert receipt["usage"]["output_tokens"] == OUTPUT_TOKENS
    expected = cost_of_tokens(INPUT_TOKENS, INPUT_PRICE) + cost_of_tokens(
        OUTPUT_TOKENS, OUTPUT_PRICE
    )
    assert micros(receipt["cost"]) == expected == 108


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_max_tokens_stop_is_length(http, stream):
    response = http.post("/v1/chat/completions", json=_chat("br/length", stream))
    assert response.status_code == 200
    if stream:
        finishes = [
            c["choices"][0]["finish_reason"]
            for c in sse_payloads(response.content)
            if isinstance(c, dict) and c.get("choices") and c["choices"][0]["finish_reason"]
        ]
        assert finishes == ["length"]
        assert _stream_text(response.content) == "".join(REPLY_PIECES[:2])
    else:
        assert response.json()["choices"][0]["finish_reason"] == "length"


# --- credentials -------------------------------------------------------------------------

REJECTED = "credentials rejected by provider br-wrong (HTTP 403)"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_wrong_secret_is_credentials_rejected(http, gw, fake, stream):
    before, logged = len(fake.refused), gw.log().count(REJECTED)
    response = http.post("/v1/chat/completions", json=_chat("wrong/normal", stream))
    assert_error(response, 502, "provider_error")
    assert fake.refused[before:] == ["InvalidSignatureException"]  # it did reach the fake
    assert gw.log().count(REJECTED) == logged + 1


def test_rejected_credentials_fall_back_to_the_next_provider(http, fake):
    before = len(fake.refused)
    response = http.post("/v1/chat/completions", json=_chat("wrong/fallback"))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "local"
    assert response.json()["choices"][0]["message"]["content"] == PROMPT  # echo's answer
    assert fake.refused[before:] == ["InvalidSignatureException"]


@pytest.mark.parametrize("model", ["temp/normal", "chain/normal"], ids=["named", "default-chain"])
def test_a_session_token_is_sent_signed_and_checked(http, fake, model):
    response = http.post("/v1/chat/completions", json=_chat(model))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY
    upstream = {"temp/normal": "temp-probe", "chain/normal": "chain-probe"}[model]
    [sent] = fake.model_requests(upstream)
    assert sent.headers["x-amz-security-token"] == SESSION_TOKEN
    assert "x-amz-security-token" in sent.headers["authorization"]  # among SignedHeaders
    assert f"Credential={TEMP_ACCESS_KEY}/" in sent.headers["authorization"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_named_variable_unset_is_503_and_nothing_is_sent(http, fake, stream):
    response = http.post("/v1/chat/completions", json=_chat("unset/normal", stream))
    assert_error(response, 503, "service_unavailable")
    assert fake.model_requests("unset-probe") == []


def test_a_default_chain_that_finds_nothing_is_503_and_nothing_is_sent(tmp_path, fake):
    config = f"""
[providers.br-none]
kind = "bedrock"
base_url = "{fake.url}"
region = "{REGION}"
""" + _model("none/normal", "br-none", "none-probe")
    nowhere = str(tmp_path / "absent")
    process = GatewayProcess(tmp_path, extra_config=config)
    for variable in (*CHAIN_ENV, *CHAIN_SOURCES):
        process.env.pop(variable, None)
    process.env |= {
        "AWS_SHARED_CREDENTIALS_FILE": nowhere,
        "AWS_CONFIG_FILE": nowhere,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with process:
        key = process.create_key(process.cli("projects", "create", "p", "--balance", "10")["id"])
        response = httpx.post(
            process.url + "/v1/chat/completions",
            json=_chat("none/normal"),
            headers={"authorization": f"Bearer {key}"},
            timeout=20,
        )
        assert_error(response, 503, "service_unavailable")
        assert "no AWS credentials found" in process.log()
    assert fake.model_requests("none-probe") == []


# --- upstream failures -------------------------------------------------------------------

# The upstream's faults (throttled, failing, its model failing: ModelErrorException).
FAILING = ["fault-429", "fault-500", "fault-424"]


@pytest.mark.parametrize(
    ("mode", "stream", "status", "error_type"),
    [
        *[(mode, stream, 502, "provider_error") for mode in FAILING for stream in (False, True)],
        *[("fault-400", stream, 400, "invalid_request") for stream in (False, True)],
        # A stream's are in band (below): its first event came before.
        ("malformed-shape", False, 502, "provider_error"),
        ("cut-mid-stream", False, 502, "provider_error"),
    ],
)
def test_refusals_and_malformed_answers(http, mode, status, error_type, stream):
    response = http.post("/v1/chat/completions", json=_chat(f"br/{mode}", stream))
    assert_error(response, status, error_type)
    assert SECRET not in response.text


@pytest.mark.parametrize(
    ("mode", "delivered"),
    [
        ("stream-exception", REPLY_PIECES[:2]),  # an exception frame after two text events
        ("cut-mid-stream", REPLY_PIECES[:3]),  # the connection cut after three
        ("bad-crc", REPLY_PIECES[:2]),  # the third frame's CRC fails
        ("malformed-shape", []),  # the first text delta is not an object
        ("no-metadata", REPLY_PIECES),  # ended after messageStop: no usage, not complete
    ],
)
def test_a_stream_that_fails_after_it_opened_ends_in_band(http, mode, delivered):
    response = http.post("/v1/chat/completions", json=_chat(f"br/{mode}", True))
    error = _in_band_error(response)
    assert error["type"] == "provider_error"
    assert _stream_text(response.content) == "".join(delivered)
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}")
    if delivered:  # what was delivered is billed, as failed
        assert receipt.json()["status"] == "failed"
    else:  # nothing delivered, nothing billed
        assert_error(receipt, 404, "not_found")


def test_nothing_secret_leaks_into_the_log(gw, http):
    for mode in ("fault-429", "fault-500", "stream-exception"):
        http.post("/v1/chat/completions", json=_chat(f"br/{mode}", True))
    log = gw.log()
    for secret in (SECRET, SECRET_KEY, TEMP_SECRET_KEY, SESSION_TOKEN, "not/the/secret"):
        assert secret not in log


# --- the fake checks like AWS --------------------------------------------------------------


def _signed(url: str, body: bytes, secret: str = SECRET_KEY, token: str | None = None) -> dict:
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"content-type": "application/json"}
    )
    SigV4Auth(
        Credentials(ACCESS_KEY if token is None else TEMP_ACCESS_KEY, secret, token),
        "bedrock",
        REGION,
    ).add_auth(request)
    return dict(request.headers.items())


def _raw_post(fake: FakeBedrock, path: str, body: bytes, headers: dict) -> tuple[int, dict, str]:
    """POST with the path sent byte for byte as given (no client normalizes it)."""
    connection = HTTPConnection("127.0.0.1", fake.port, timeout=10)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


BODY = json.dumps({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}).encode()


def _base(fake: FakeBedrock) -> str:
    return f"http://127.0.0.1:{fake.port}"


def test_the_fake_accepts_a_request_signed_as_aws_signs(fake):
    path = "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    status, _, text = _raw_post(fake, path, BODY, _signed(_base(fake) + path, BODY))
    assert status == 200, text


@pytest.mark.parametrize(
    "tamper",
    ["wrong-secret", "body-changed", "path-form", "old-date", "region", "sha-header", "no-token"],
)
def test_the_fake_refuses_what_aws_refuses(fake, tamper):
    path = "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    body, secret, token = BODY, SECRET_KEY, None
    if tamper == "wrong-secret":
        secret = "another/secret"
    if tamper == "no-token":
        secret, token = TEMP_SECRET_KEY, SESSION_TOKEN
    headers = _signed(_base(fake) + path, body, secret, token)
    if tamper == "body-changed":
        body = body.replace(b"hi", b"ho")
    if tamper == "path-form":  # signed over %3A, sent as ':': another canonical path
        path = path.replace("%3A", ":")
    if tamper == "old-date":
        old = datetime(2020, 1, 1, tzinfo=UTC)
        headers["X-Amz-Date"] = old.strftime("%Y%m%dT%H%M%SZ")
    if tamper == "region":
        headers["Authorization"] = headers["Authorization"].replace(f"/{REGION}/", "/eu-west-1/")
    if tamper == "sha-header":
        headers["x-amz-content-sha256"] = hashlib.sha256(b"other").hexdigest()
    if tamper == "no-token":
        del headers["X-Amz-Security-Token"]
    status, response_headers, text = _raw_post(fake, path, body, headers)
    assert status == 403, text
    expected = (
        "UnrecognizedClientException" if tamper == "no-token" else "InvalidSignatureException"
    )
    assert response_headers["x-amzn-errortype"] == expected
    if tamper in ("wrong-secret", "body-changed", "path-form"):
        assert "The request signature we calculated does not match" in json.loads(text)["message"]


def test_the_fake_refuses_an_unknown_access_key(fake):
    path = "/model/normal/converse"
    headers = _signed(_base(fake) + path, BODY)
    headers["Authorization"] = headers["Authorization"].replace(ACCESS_KEY, "AKIAUNKNOWN000000000")
    status, response_headers, _ = _raw_post(fake, path, BODY, headers)
    assert (status, response_headers["x-amzn-errortype"]) == (403, "UnrecognizedClientException")
