"""The provider contract: every upstream provider kind through the same cases on every
inbound API (chat, Responses and Messages, plain and streamed, with the official SDKs;
tests/support/contract.py), one real `gateway serve` in front of one fake of each
vendor, each checking credentials and bodies as its vendor does (tests/support/fake_*).

Models are `<kind>/<mode>`: a provider named after its kind, the fake's mode as the
upstream name, the same prices everywhere, a different one for each token class; the
built-in echo kind takes the cases that apply to it, with its own answers. Cases: an
answer, its usage and its exact receipt; a tool call and the turn with its result; the
vendor's max-tokens stop; cache reads, cache writes and reasoning in the vendor's own
usage, each billed at its class's price; a price tier; credentials rejected (502,
logged, a fallback to echo); upstream failures (429, 500, a stream cut, a malformed
answer); credentials missing (503, nothing sent).

Billing is checked exactly (decisions.md, "Prices, exactly"): the receipt shows every
class, the prices applied and the cost the spec's rule gives, computed here from the
usage the vendor reported in its own shape; the project's balance moves by that cost.

A gateway bug a case shows is an xfail (strict) in GATEWAY_BUGS, named by (case, kind,
api).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.metering.billing import books, micros
from tests.support import fake_anthropic
from tests.support.contract import APIS, Answer, Api, Clients, Failure, Usage, sse_events
from tests.support.errors import assert_error
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_azure import FakeAzure
from tests.support.fake_bedrock import ACCESS_KEY, CACHE_READ, CACHE_WRITE, FakeBedrock
from tests.support.fake_gemini import CACHED_TOKENS, THOUGHT_TOKENS, FakeGemini, FakeVertex
from tests.support.fake_openai import CACHED_READS, REASONING, FakeOpenAI
from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY,
    REPLY_PIECES,
    SECRET,
    Recorded,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import ANTHROPIC_CREDENTIAL, NO_BREAKER, OPENAI_CREDENTIAL

KINDS = ["openai", "azure", "anthropic", "gemini", "vertex", "bedrock"]
ECHO = "echo"  # the built-in kind: its provider is the base config's "local"
FAKES = {
    "openai": lambda: FakeOpenAI(OPENAI_CREDENTIAL),
    "azure": FakeAzure,
    "anthropic": lambda: FakeAnthropic(ANTHROPIC_CREDENTIAL),
    "gemini": FakeGemini,
    "vertex": FakeVertex,
    "bedrock": FakeBedrock,
}
MODES = ["normal", "tool-call", "length", "cached", "fault-401", "fault-429", "fault-500"]
MODES += ["cut-mid-stream", MALFORMED]
# USD per million tokens of each class (the config's `<class>_price_per_mtok`), every
# model's: no two alike, so that a token billed in another class changes the cost, and in
# cents, so that a class's share of it is a fraction of a micro-unit (rounded up once).
PRICES = {
    "input": "3.00",
    "cached_input": "0.30",
    "cache_write": "3.75",
    "cache_write_1h": "6.00",
    "output": "15.00",
}
# The tier of the tier models, whose threshold the input of some exceeds: all different.
TIER_PRICES = {
    "input": "6.00",
    "cached_input": "0.60",
    "cache_write": "7.50",
    "cache_write_1h": "12.00",
    "output": "22.50",
}
LIMIT = 16  # the output limit of the length case (Responses takes no fewer)
# Longer than LIMIT tokens, so that the echo stops at the limit too.
PROMPT = "Tell me something about the weather in Paris today, please."
TO_ECHO = 'fallbacks = [{provider = "local", upstream = "echo-1"}]'

# Gateway bugs the cases show: (case, kind, api) -> what is wrong.
GATEWAY_BUGS: dict[tuple[str, str, str], str] = {}


def matrix(case: str, kinds: list[str] = KINDS) -> list:
    """(kind, api) for every kind and inbound API, with the case's xfails."""
    params = []
    for kind in kinds:
        for api in APIS:
            bug = GATEWAY_BUGS.get((case, kind, repr(api)))
            marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
            params.append(pytest.param(kind, api, id=f"{kind}-{api!r}", marks=marks))
    return params


# --- what each kind answers, and what its vendor received ------------------------------------


class Replies:
    """What the fakes answer (tests/support/fake_upstream.py)."""

    def text(self, prompt: str) -> str:
        return REPLY

    def usage(self, prompt: str) -> Usage:
        return Usage(INPUT_TOKENS, OUTPUT_TOKENS)

    def arguments(self, prompt: str) -> dict:
        return {"city": "Paris"}

    def said(self, result: str) -> str:
        return f"The tool said: {result}"

    def cut(self, prompt: str) -> str:
        return "".join(REPLY_PIECES[:2])


class EchoReplies(Replies):
    """The echo's: the prompt, counted by the gateway's estimate; a forced tool call with
    the prompt as its argument; the tool's result as it came; the prompt cut at the limit."""

    def text(self, prompt: str) -> str:
        return prompt

    def usage(self, prompt: str) -> Usage:
        return Usage(estimate_tokens(prompt), estimate_tokens(prompt))

    def arguments(self, prompt: str) -> dict:
        return {"text": prompt}

    def said(self, result: str) -> str:
        return result

    def cut(self, prompt: str) -> str:
        return prompt[: LIMIT * 4]


REPLIES = {kind: Replies() for kind in KINDS} | {ECHO: EchoReplies()}


def _google_model(sent: Recorded) -> str:
    return sent.path.rpartition("/models/")[2].partition(":")[0]


def _chat_limit(sent: Recorded) -> int | None:
    return sent.body.get("max_completion_tokens") or sent.body.get("max_tokens")


def _openai_limit(sent: Recorded) -> int | None:
    """Chat Completions', or Responses' (which the Responses API passes to its upstream)."""
    return _chat_limit(sent) or sent.body.get("max_output_tokens")


def _bearer(sent: Recorded) -> str:
    return sent.headers.get("authorization", "").removeprefix("Bearer ")


@dataclass(frozen=True)
class Vendor:
    """How a kind's request names the upstream model, carries the credential the fake
    knows, and says the output limit."""

    model: Callable[[Recorded], str]
    authorized: Callable[[object, Recorded], bool]
    limit: Callable[[Recorded], int | None]


VENDORS = {
    "openai": Vendor(
        lambda sent: sent.body["model"],
        lambda fake, sent: _bearer(sent) == fake.credential,
        _openai_limit,
    ),
    "azure": Vendor(
        lambda sent: sent.path.split("/")[3],  # /openai/deployments/{upstream}/...
        lambda fake, sent: sent.headers.get("api-key") == fake.credential,
        _chat_limit,
    ),
    "anthropic": Vendor(
        lambda sent: sent.body["model"],
        lambda fake, sent: sent.headers.get("x-api-key") == fake.credential,
        lambda sent: sent.body["max_tokens"],
    ),
    "gemini": Vendor(
        _google_model,
        lambda fake, sent: sent.headers.get("x-goog-api-key") == fake.api_key,
        lambda sent: sent.body["generationConfig"]["maxOutputTokens"],
    ),
    "vertex": Vendor(
        _google_model,
        lambda fake, sent: _bearer(sent) in fake.issued,
        lambda sent: sent.body["generationConfig"]["maxOutputTokens"],
    ),
    "bedrock": Vendor(
        lambda sent: sent.path.split("/")[2],  # /model/{upstream}/converse...
        lambda fake, sent: sent.headers.get("authorization", "").startswith(
            f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/"
        ),
        lambda sent: sent.body["inferenceConfig"]["maxTokens"],
    ),
}


# --- the `cached` mode's usage, as each vendor reports it ------------------------------------
# Each vendor's usage object as its fake reports it, and its convention read into the
# gateway's classes (all input and all output, the classes within them).


def _openai_usage(usage: dict) -> Usage:
    """Chat Completions' (Responses' has the same counts in its own names): prompt and
    completion tokens are all of each, the cache's reads and the reasoning within them."""
    return Usage(
        usage["prompt_tokens"],
        usage["completion_tokens"],
        cache_reads=usage["prompt_tokens_details"]["cached_tokens"],
        reasoning=usage["completion_tokens_details"]["reasoning_tokens"],
    )


def _anthropic_usage(usage: dict) -> Usage:
    """Messages': `input_tokens` is the input the cache neither read nor wrote; the
    writes are split by how long they stay (the 1-hour ones priced apart)."""
    reads, writes = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    return Usage(
        usage["input_tokens"] + reads + writes,
        usage["output_tokens"],
        reads,
        writes,
        usage["cache_creation"]["ephemeral_1h_input_tokens"],
    )


def _google_usage(usage: dict) -> Usage:
    """Gemini's and Vertex's: the prompt count includes the cached content; the thoughts
    are output beside the candidates'."""
    thoughts = usage["thoughtsTokenCount"]
    return Usage(
        usage["promptTokenCount"],
        usage["candidatesTokenCount"] + thoughts,
        cache_reads=usage["cachedContentTokenCount"],
        reasoning=thoughts,
    )


def _bedrock_usage(usage: dict) -> Usage:
    """Converse's: `inputTokens` is the input the cache neither read nor wrote."""
    reads, writes = usage["cacheReadInputTokens"], usage["cacheWriteInputTokens"]
    return Usage(usage["inputTokens"] + reads + writes, usage["outputTokens"], reads, writes)


OPENAI_CACHED = _openai_usage(
    {
        "prompt_tokens": INPUT_TOKENS,
        "completion_tokens": OUTPUT_TOKENS,
        "prompt_tokens_details": {"cached_tokens": CACHED_READS},
        "completion_tokens_details": {"reasoning_tokens": REASONING},
    }
)
GOOGLE_CACHED = _google_usage(
    {
        "promptTokenCount": INPUT_TOKENS,
        "cachedContentTokenCount": CACHED_TOKENS,
        "candidatesTokenCount": OUTPUT_TOKENS - THOUGHT_TOKENS,
        "thoughtsTokenCount": THOUGHT_TOKENS,
    }
)
ANTHROPIC_READS, ANTHROPIC_WRITES = fake_anthropic.CACHED_READS, fake_anthropic.CACHED_WRITES
CACHED = {
    "openai": OPENAI_CACHED,
    "azure": OPENAI_CACHED,
    "anthropic": _anthropic_usage(
        {
            "input_tokens": INPUT_TOKENS - ANTHROPIC_READS - ANTHROPIC_WRITES,
            "cache_read_input_tokens": ANTHROPIC_READS,
            "cache_creation_input_tokens": ANTHROPIC_WRITES,
            "cache_creation": {
                "ephemeral_5m_input_tokens": ANTHROPIC_WRITES - fake_anthropic.CACHED_WRITES_1H,
                "ephemeral_1h_input_tokens": fake_anthropic.CACHED_WRITES_1H,
            },
            "output_tokens": OUTPUT_TOKENS,
        }
    ),
    "gemini": GOOGLE_CACHED,
    "vertex": GOOGLE_CACHED,
    "bedrock": _bedrock_usage(
        {
            "inputTokens": INPUT_TOKENS - CACHE_READ - CACHE_WRITE,
            "cacheReadInputTokens": CACHE_READ,
            "cacheWriteInputTokens": CACHE_WRITE,
            "outputTokens": OUTPUT_TOKENS,
        }
    ),
}


# --- the gateway -----------------------------------------------------------------------------


def _prices(prices: dict[str, str]) -> str:
    return "".join(f'{name}_price_per_mtok = "{price}"\n' for name, price in prices.items())


def _model(model_id: str, provider: str, upstream: str, extra: str = "") -> str:
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
{_prices(PRICES)}supports_tools = true
max_output_tokens = 256
{extra}
"""


def _tiered(model_id: str, provider: str, above_input_tokens: int) -> str:
    """A model of the `cached` mode with a tier above `above_input_tokens`."""
    tier = f"""[[models."{model_id}".price_tiers]]
above_input_tokens = {above_input_tokens}
{_prices(TIER_PRICES)}"""
    return _model(model_id, provider, "cached") + tier


def _not_configured(fake, name: str, folder) -> str:
    """A provider of the fake's kind whose named credentials are missing: its variables
    renamed to ones never set, its credentials file one that does not exist."""
    block, variables = fake.provider_config(name)
    for variable in variables:
        block = block.replace(f'"{variable}"', f'"CONTRACT_NEVER_SET_{variable}"')
    absent = f'credentials_file = "{folder}/absent.json"'
    block, files = re.subn(r"^credentials_file = .*$", absent, block, flags=re.MULTILINE)
    assert variables or files, f"{name}: no credential named, nothing to leave missing"
    return block


@pytest.fixture(scope="module")
def fakes():
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(make()) for kind, make in FAKES.items()}


@pytest.fixture(scope="module")
def gw(tmp_path_factory, fakes):
    folder = tmp_path_factory.mktemp("contract")
    config, env = NO_BREAKER, {}
    for kind, fake in fakes.items():
        block, variables = fake.provider_config(kind)
        config += block + _not_configured(fake, f"{kind}-unset", folder)
        env |= variables
        for mode in MODES:
            config += _model(f"{kind}/{mode}", kind, mode)
        config += _model(f"{kind}/401-falls-back", kind, "fault-401", TO_ECHO)
        # Its input exceeds the tier's threshold by one, or just reaches it.
        config += _tiered(f"{kind}/tier-above", kind, CACHED[kind].input - 1)
        config += _tiered(f"{kind}/tier-at", kind, CACHED[kind].input)
        config += _model(f"{kind}/unset", f"{kind}-unset", "normal")
    for mode in ("normal", "tool-call", "length"):
        config += _model(f"{ECHO}/{mode}", "local", "echo-1")
    with GatewayProcess(folder, extra_config=config, env=env) as process:
        yield process


@pytest.fixture(scope="module")
def key(gw) -> str:
    project = gw.create_project("contract", "--balance", "1000")
    return gw.create_key(project, "inference,receipts")


def _clients(gw: GatewayProcess, key: str) -> Clients:
    return Clients(
        openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20),
        anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=20),
    )


def _http(gw: GatewayProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"x-api-key": key}, timeout=20)


@pytest.fixture(scope="module")
def clients(gw, key) -> Clients:
    return _clients(gw, key)


@pytest.fixture(scope="module")
def http(gw, key):
    with _http(gw, key) as session:
        yield session


@dataclass
class Payer:
    project: str
    clients: Clients
    http: httpx.Client


@pytest.fixture(scope="module")
def payer(gw):
    """A project of the billing cases alone, whose books nothing else moves (another
    case's request may still be settling when the next one starts)."""
    project = gw.create_project("contract-billed", "--balance", "1000")
    key = gw.create_key(project, "inference,receipts")
    with _http(gw, key) as session:
        yield Payer(project, _clients(gw, key), session)


# --- helpers ---------------------------------------------------------------------------------


def _prompt() -> str:
    """PROMPT with a marker that finds the request at the fake."""
    return f"{PROMPT} [{uuid.uuid4().hex[:12]}]"


def _provider(kind: str) -> str:
    return "local" if kind == ECHO else kind


def _answer(outcome: Answer | Failure) -> Answer:
    assert isinstance(outcome, Answer), outcome
    return outcome


def _cost(usage: Usage, prices: dict[str, str]) -> str:
    """The spec's cost: the tokens of each class x its price, summed, rounded up to the
    micro-unit once; uncached input is all input less the cache's reads and writes, and
    output includes reasoning. Tokens x USD per million tokens = micro-units."""
    tokens = {
        "input": usage.input - usage.cache_reads - usage.cache_writes,
        "cached_input": usage.cache_reads,
        "cache_write": usage.cache_writes - usage.cache_writes_1h,
        "cache_write_1h": usage.cache_writes_1h,
        "output": usage.output,
    }
    cost = math.ceil(sum(count * Decimal(prices[name]) for name, count in tokens.items()))
    return f"{cost // 1_000_000}.{cost % 1_000_000:06d}"


def _billed(gw: GatewayProcess, payer: Payer, api: Api, model: str, prompt: str):
    """Ask as the payer: the answer and its receipt, the project's balance moved by
    exactly the receipt's cost and nothing left held."""
    before = books(gw, payer.project)
    answer = _answer(api.ask(payer.clients, model, prompt))
    receipt = _receipt(payer.http, answer.headers)
    after = books(gw, payer.project)
    assert before["balance"] - after["balance"] == micros(receipt["cost"])
    assert after["month_spend"] - before["month_spend"] == micros(receipt["cost"])
    assert after["reserved"] == 0
    return answer, receipt


def _priced(receipt: dict, usage: Usage, prices: dict[str, str]) -> None:
    """The receipt bills `usage` by class at `prices`, as the spec computes it."""
    assert receipt["usage"] == usage.receipt()
    assert receipt["prices"] == {name: f"{Decimal(p):.6f}" for name, p in prices.items()}
    assert receipt["cost"] == _cost(usage, prices)


def _until(find: Callable, what: str):
    """find()'s first truthy value, within 5 s (the gateway writes receipts and logs as
    it finishes an answer, which the client may have read in full just before)."""
    deadline = time.monotonic() + 5
    while not (found := find()):
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
    return found


def _receipt(http: httpx.Client, headers) -> dict:
    path = f"/v1/receipts/{headers['x-receipt-id']}"

    def fetch() -> dict | None:
        response = http.get(path)
        return response.json() if response.status_code == 200 else None

    return _until(fetch, f"no receipt at {path}")


def _logged(gw: GatewayProcess, request_id: str, text: str) -> list[str]:
    def lines() -> list[str]:
        return [line for line in gw.log().splitlines() if request_id in line and text in line]

    return _until(lines, f"{text!r} not logged for {request_id}")


def _sent(fakes: dict, kind: str, prompt: str, upstream: str, count: int = 1) -> list[Recorded]:
    """The requests with `prompt` that reached the kind's fake: `count` of them, each for
    the upstream model name, with the credential the fake knows."""
    fake, vendor = fakes[kind], VENDORS[kind]
    sent = fake.sent(marker=prompt)
    assert len(sent) == count, sent
    assert all(vendor.model(request) == upstream for request in sent)
    assert all(vendor.authorized(fake, request) for request in sent)
    return sent


def _refused(outcome: Answer | Failure, status: int, error_type: str) -> dict:
    """An error answered before any output: the spec's error object, nothing of the
    upstream's body, nothing billed."""
    assert isinstance(outcome, Failure) and outcome.response is not None, outcome
    error = assert_error(outcome.response, status, error_type)
    assert SECRET not in outcome.body
    assert "x-receipt-id" not in outcome.headers
    return error


def _in_band(outcome: Answer | Failure, gw: GatewayProcess, http: httpx.Client) -> Failure:
    """A stream that started, then failed with the API's in-band error: provider_error,
    nothing of the upstream's words; a failed receipt when it had delivered output, else
    none (decisions.md: the receipt id sent with the stream's first byte then answers 404,
    once the request is done: its access line is written after the settlement)."""
    assert isinstance(outcome, Failure) and outcome.status == 200, outcome
    assert outcome.error["type"] == "provider_error", outcome.error
    request_id = outcome.headers["x-request-id"]
    assert outcome.error["request_id"] == request_id
    assert SECRET not in outcome.body
    if outcome.text:
        assert _receipt(http, outcome.headers)["status"] == "failed"
    else:
        _logged(gw, request_id, f"gateway.access {request_id} ")
        assert http.get(f"/v1/receipts/{outcome.headers['x-receipt-id']}").status_code == 404
    return outcome


def _raw_in_band(api: Api, http: httpx.Client, model: str, prompt: str) -> None:
    """The same failing stream asked with raw httpx: its bytes end with the API's own
    in-band error event (Api.in_band_error), nothing of the upstream's words in them."""
    response = api.raw_stream(http, model, prompt)
    assert response.status_code == 200
    assert SECRET not in response.text
    error = api.in_band_error(sse_events(response.content))
    assert error["type"] == "provider_error"
    assert error["request_id"] == response.headers["x-request-id"]


# --- 1. an answer, its usage, its receipt ----------------------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("normal", [*KINDS, ECHO]))
def test_answer_usage_and_receipt(kind: str, api: Api, gw, payer, fakes):
    prompt, model, replies = _prompt(), f"{kind}/normal", REPLIES[kind]
    answer, receipt = _billed(gw, payer, api, model, prompt)
    assert (answer.model, answer.text) == (model, replies.text(prompt))
    assert answer.stop == api.stops["normal"]
    if api.stream:
        assert answer.pieces > 1, "the answer came in one piece: not streamed"
    usage = replies.usage(prompt)
    assert answer.usage == api.shown(usage)
    assert answer.headers["x-gateway-provider"] == _provider(kind)
    assert (receipt["status"], receipt["model"]) == ("succeeded", model)
    assert receipt["provider"] == _provider(kind)
    _priced(receipt, usage, PRICES)
    if kind != ECHO:
        _sent(fakes, kind, prompt, "normal")


# --- 2. a tool call, then its result ---------------------------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("tool", [*KINDS, ECHO]))
def test_tool_call_then_its_result(kind: str, api: Api, clients, fakes):
    prompt, model, replies = _prompt(), f"{kind}/tool-call", REPLIES[kind]
    called = _answer(api.ask(clients, model, prompt, tools=True))
    assert called.stop == api.stops["tool"]
    [call] = called.calls
    assert (call.name, call.arguments) == ("get_weather", replies.arguments(prompt))
    assert call.id
    answered = _answer(api.ask(clients, model, prompt, tools=True, after=(called, "sunny")))
    assert answered.text == replies.said("sunny")
    assert answered.stop == api.stops["normal"]
    if kind != ECHO:
        _sent(fakes, kind, prompt, "tool-call", count=2)


# --- 3. the vendor's max-tokens stop ---------------------------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("length", [*KINDS, ECHO]))
def test_the_vendors_length_stop(kind: str, api: Api, clients, http, fakes):
    prompt = _prompt()
    answer = _answer(api.ask(clients, f"{kind}/length", prompt, limit=LIMIT))
    assert answer.stop == api.stops["length"]
    assert answer.text == REPLIES[kind].cut(prompt)
    assert _receipt(http, answer.headers)["status"] == "succeeded"
    if kind != ECHO:
        [sent] = _sent(fakes, kind, prompt, "length")
        assert VENDORS[kind].limit(sent) == LIMIT


# --- 4. cache reads and writes, reasoning; a price tier --------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("cached"))
def test_each_token_class_is_billed_at_its_price(kind: str, api: Api, gw, payer, fakes):
    prompt, model, usage = _prompt(), f"{kind}/cached", CACHED[kind]
    answer, receipt = _billed(gw, payer, api, model, prompt)
    assert answer.text == REPLY  # a reasoning part, if any, is not shown
    assert answer.usage == api.shown(usage)
    assert receipt["status"] == "succeeded"
    _priced(receipt, usage, PRICES)
    _sent(fakes, kind, prompt, "cached")


@pytest.mark.parametrize("side", ["above", "at"])
@pytest.mark.parametrize(("kind", "api"), matrix("tier"))
def test_a_price_tier_prices_the_whole_request(kind: str, api: Api, side, gw, payer):
    """The tier prices every class of a request whose input exceeds its threshold, and
    none of one whose input only reaches it."""
    _, receipt = _billed(gw, payer, api, f"{kind}/tier-{side}", _prompt())
    _priced(receipt, CACHED[kind], TIER_PRICES if side == "above" else PRICES)


# --- 5. credentials rejected -----------------------------------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("credentials"))
def test_rejected_credentials_are_a_logged_provider_error(kind: str, api: Api, clients, gw, fakes):
    prompt = _prompt()
    error = _refused(api.ask(clients, f"{kind}/fault-401", prompt), 502, "provider_error")
    _sent(fakes, kind, prompt, "fault-401")
    _logged(gw, error["request_id"], f"credentials rejected by provider {kind}")
    assert SECRET not in gw.log()


@pytest.mark.parametrize(("kind", "api"), matrix("fallback"))
def test_rejected_credentials_fall_back_to_echo(kind: str, api: Api, clients, fakes):
    prompt = _prompt()
    answer = _answer(api.ask(clients, f"{kind}/401-falls-back", prompt))
    assert answer.headers["x-gateway-provider"] == "local"
    assert answer.text == prompt  # the echo's answer
    _sent(fakes, kind, prompt, "fault-401")  # tried once, refused, then the echo


# --- 6. upstream failures --------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500])
@pytest.mark.parametrize(("kind", "api"), matrix("fault"))
def test_upstream_errors_are_provider_errors(kind: str, api: Api, status, clients, gw, fakes):
    prompt = _prompt()
    _refused(api.ask(clients, f"{kind}/fault-{status}", prompt), 502, "provider_error")
    _sent(fakes, kind, prompt, f"fault-{status}")
    assert SECRET not in gw.log()


@pytest.mark.parametrize(("kind", "api"), matrix("cut"))
def test_a_cut_answer(kind: str, api: Api, clients, gw, http, fakes):
    prompt, model = _prompt(), f"{kind}/cut-mid-stream"
    outcome = api.ask(clients, model, prompt)
    if api.stream:  # three text events came before the cut
        assert _in_band(outcome, gw, http).text == "".join(REPLY_PIECES[:3])
        _raw_in_band(api, http, model, prompt)
    else:  # half a body
        _refused(outcome, 502, "provider_error")
    _sent(fakes, kind, prompt, "cut-mid-stream", count=2 if api.stream else 1)


@pytest.mark.parametrize(("kind", "api"), matrix("malformed"))
def test_a_malformed_answer(kind: str, api: Api, clients, gw, http, fakes):
    prompt, model = _prompt(), f"{kind}/{MALFORMED}"
    outcome = api.ask(clients, model, prompt)
    if api.stream:  # its first event was fine: the stream had started
        _in_band(outcome, gw, http)
        _raw_in_band(api, http, model, prompt)
    else:
        _refused(outcome, 502, "provider_error")
    _sent(fakes, kind, prompt, MALFORMED, count=2 if api.stream else 1)


# --- 7. credentials missing ------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "api"), matrix("unset"))
def test_missing_credentials_are_not_configured(kind: str, api: Api, clients, fakes):
    fake, prompt = fakes[kind], _prompt()
    before = (len(fake.requests), getattr(fake, "token_requests", 0))
    _refused(api.ask(clients, f"{kind}/unset", prompt), 503, "service_unavailable")
    assert (len(fake.requests), getattr(fake, "token_requests", 0)) == before
