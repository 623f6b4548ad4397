"""config.toml decoded into typed structs at start-up; a typo or wrong type names its key."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from model_gateway.gateway.metering.money import parse_amount

DEFAULT_CONFIG = "config.toml"


class ConfigError(Exception):
    pass


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Micros(int):
    """An amount in micro-units, written in TOML as a decimal string ("0.50") or number."""


def _decode_hook(type_: type, value: object) -> object:
    if type_ is Micros:
        if isinstance(value, str | int | float):
            return Micros(parse_amount(value))  # a ValueError here names the key's path
        raise ValueError("an amount must be a decimal string or a number")
    raise NotImplementedError


_PUBLIC_URL = r"\Ahttps?://[^/\s?#]+[^\s?#]*\Z"


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    environment: Literal["development", "production"] = "development"
    cors_origins: list[str] = []
    log_format: Literal["text", "json"] = "text"
    access_log: bool = True  # one line per request (gateway.logs)
    # The address clients reach the gateway at, mount prefix included
    # ("https://gw.example.com/llm"). Public pages build their links from it, never from
    # the request's Host header; unset, they use links relative to this server.
    # http(s), a host, an optional path; no query or fragment to append paths after.
    public_url: Annotated[str, msgspec.Meta(pattern=_PUBLIC_URL)] | None = None
    # Hostile clients (decisions.md, "Hardening decisions"): a request line plus headers
    # over this many bytes is refused with 431 before the rest is read.
    max_head_bytes: int = 65536
    head_timeout_s: float = 30.0  # a head not complete this long after it began
    body_timeout_s: float = 60.0  # a request body that sends nothing for this long
    # Serving processes sharing the port and the database (decisions.md, "Every core of
    # one box"); 0: one per core. `gateway serve --workers N` overrides it.
    workers: Annotated[int, msgspec.Meta(ge=0)] = 1

    def __post_init__(self) -> None:
        # A head limit below a minimal request would refuse every client.
        if self.max_head_bytes < 1024:
            raise ValueError("max_head_bytes must be at least 1024")
        for name in ("head_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


class StorageConfig(_Section):
    url: str = "sqlite:///data/gateway.db"


class SecretsConfig(_Section):
    key_pepper_file: str = "data/key-pepper"
    signing_key_file: str = "data/signing-key"


class LimitsConfig(_Section):
    gateway_timeout_s: float = 120.0
    default_project_rpm: int = 600
    default_key_rpm: int = 600


class RateLimitConfig(_Section):
    # Where the requests-per-minute buckets live, shared by every instance (gateway.ratelimit).
    # Unset: in PostgreSQL when it is the storage, in this process's memory with SQLite.
    url: str | None = None  # redis://[user:password@]host:6379[/db] or rediss://
    prefix: str = "gateway:rl:"  # of the Redis keys, so deployments can share a server

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("redis://", "rediss://")):
            raise ValueError("url must be a redis:// or rediss:// URL")


class MetricsConfig(_Section):
    # GET /metrics (no key): bound to the listen address like the API itself.
    enabled: bool = True


class MeteringConfig(_Section):
    # Off only for benchmarks that measure what metering costs; never in production.
    enabled: bool = True
    # While this process's writes are idle, requests reserve in memory against slices it
    # leased (gateway/metering/leased_meter.py); a stream's hold, and every hold when off,
    # is written before the provider is called.
    leases: bool = True


class OidcConfig(_Section):
    """`[console.oidc]`: sign-in with the team's identity provider (decisions.md,
    "Operators (wave 3)"). The issuer must be https, but http://127.0.0.1 in development."""

    issuer: str
    client_id: str
    client_secret_env: str | None = None  # the variable holding the client secret
    allowed_email_domains: list[str] = []  # empty: any verified email
    default_role: Literal["owner", "member"] = "member"  # of a user's first sign-in


class TelemetryConfig(_Section):
    # OTLP/HTTP base URL (as OTEL_EXPORTER_OTLP_ENDPOINT): spans go to <base>/v1/traces.
    # Unset: no traces, whatever the OTEL_* variables say.
    otlp_endpoint: str | None = None


class ConsoleConfig(_Section):
    session_idle_s: int = 12 * 3600  # a session unused this long is gone
    login_window_s: int = 15 * 60  # failed sign-ins count within this window
    login_failures_per_email: int = 5  # then 429 until the window passes
    login_failures_per_address: int = 50
    oidc: OidcConfig | None = None  # single sign-on, off unless configured


class PurchasesConfig(_Section):
    """Onchain purchases: transfers of an ERC-20 stablecoin to the treasury, read over
    JSON-RPC from a node the operator trusts."""

    rpc_url: str
    chain_id: int
    token_address: str
    token_decimals: int
    treasury_address: str
    usd_per_token: str  # a decimal string, e.g. "1" or "0.9998"
    confirmations: int = 12
    rpc_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("token_address", "treasury_address"):
            if not re.fullmatch(r"0x[0-9a-fA-F]{40}", getattr(self, name)):
                raise ValueError(f"{name} must be 0x followed by 40 hex digits")
        if not 0 <= self.token_decimals <= 36 or self.confirmations < 1:
            raise ValueError("token_decimals must be 0..36 and confirmations at least 1")
        if not re.fullmatch(r"\d+(\.\d+)?", self.usd_per_token):
            raise ValueError('usd_per_token must be a decimal string such as "1"')


# The vendor's public address for each kind (`base_url` points a test at a local fake).
# Azure's is the operator's own resource; `{region}` and `{location_host}` (vertex's
# `location` and a dash, none for "global") are the provider's.
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "vertex": "https://{location_host}aiplatform.googleapis.com",
    "bedrock": "https://bedrock-runtime.{region}.amazonaws.com",
}
# The keys beyond kind, base_url, headers and api_key_env that each kind takes.
_KIND_KEYS: dict[str, frozenset[str]] = {
    "azure": frozenset({"api_version"}),
    "vertex": frozenset({"project", "location", "credentials_file"}),
    "bedrock": frozenset({"region", "access_key_env", "secret_key_env", "session_token_env"}),
}
_KIND_ONLY = frozenset().union(*_KIND_KEYS.values())
# Their defaults (a key left at its default is not "set").
_DEFAULTS = {"api_version": "2024-10-21", "location": "us-central1"}
_API_KEY_KINDS = frozenset({"openai", "anthropic", "azure", "gemini"})
# Kinds that cannot work without a key (an OpenAI-compatible server may need none).
_KEY_REQUIRED = frozenset({"azure", "gemini"})


class ProviderConfig(_Section):
    kind: Literal["echo", "openai", "anthropic", "azure", "gemini", "vertex", "bedrock"]
    base_url: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = {}  # extra request headers (e.g. OpenRouter's HTTP-Referer)
    api_version: str = _DEFAULTS["api_version"]  # azure
    project: str | None = None  # vertex
    location: str = _DEFAULTS["location"]  # vertex
    credentials_file: str | None = None  # vertex: a service-account JSON file
    region: str | None = None  # bedrock
    access_key_env: str | None = None  # bedrock; none named: botocore's credential chain
    secret_key_env: str | None = None
    session_token_env: str | None = None

    def __post_init__(self) -> None:
        for key in sorted(_KIND_ONLY - _KIND_KEYS.get(self.kind, frozenset())):
            if getattr(self, key) != _DEFAULTS.get(key):
                raise ValueError(f"`{key}` is not a key of a provider of kind {self.kind!r}")
        if self.api_key_env is not None and self.kind not in _API_KEY_KINDS:
            raise ValueError(f"a provider of kind {self.kind!r} takes no api_key_env")
        if self.kind in _KEY_REQUIRED and self.api_key_env is None:
            raise ValueError(f"a provider of kind {self.kind!r} needs api_key_env")
        if self.kind == "vertex" and not self.project:
            raise ValueError("a provider of kind 'vertex' needs project")
        if self.kind == "bedrock" and not self.region:
            raise ValueError("a provider of kind 'bedrock' needs region")
        if self.kind == "bedrock" and (self.access_key_env is None) != (
            self.secret_key_env is None
        ):
            raise ValueError("access_key_env and secret_key_env are named together")
        if self.kind == "azure" and not self.base_url:
            raise ValueError("a provider of kind 'azure' needs base_url (its resource's)")
        if self.base_url is None and self.kind in DEFAULT_BASE_URLS:
            template = DEFAULT_BASE_URLS[self.kind]
            # Vertex's global endpoint has no location prefix.
            host = "" if self.location == "global" else f"{self.location}-"
            self.base_url = template.format(location_host=host, region=self.region)
        for name, value in self.headers.items():
            if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
                raise ValueError(f"headers: {name!r} is not a header name")
            if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value):
                raise ValueError(f"headers.{name}: a header value is one line of text")

    def credential(self) -> str | None:
        """The upstream credential, read from the environment; None when not configured."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env) or None

    @property
    def configured(self) -> bool:
        return self.not_ready_because() is None

    def not_ready_because(self) -> str | None:
        """Why the provider cannot serve, in an operator's words; None when it can. A
        named variable unset or a named file absent is not configured; a kind with a
        library credential chain (vertex, bedrock) names nothing to use that chain."""
        named = (self.api_key_env, self.access_key_env, self.secret_key_env, self.session_token_env)
        for variable in named:
            if variable is not None and not os.environ.get(variable):
                return f"{variable} is not set"
        if self.credentials_file is not None and not os.path.isfile(self.credentials_file):
            return f"credentials_file {self.credentials_file} is not a file"
        return None


class FallbackConfig(_Section):
    """Another provider that serves the model when the ones before it fail (in order)."""

    provider: str
    upstream: str | None = None  # the model name sent to it; unset: the model's own upstream


class ClassPrices(_Section):
    """A price per token class, in micro-units per million tokens (decisions.md, "Prices,
    exactly"); unset: the class's default (see `gateway.metering.class_prices`)."""

    input_price_per_mtok: Micros | None = None
    output_price_per_mtok: Micros | None = None
    cached_input_price_per_mtok: Micros | None = None  # cache reads
    cache_write_price_per_mtok: Micros | None = None  # cache writes (Anthropic's 5-minute)
    cache_write_1h_price_per_mtok: Micros | None = None  # Anthropic's 1-hour cache writes


class PriceTier(ClassPrices, kw_only=True):
    """Prices for a request whose input tokens exceed `above_input_tokens` (the whole
    request); a class the tier leaves unset keeps the model's price."""

    above_input_tokens: Annotated[int, msgspec.Meta(ge=1)]


class ModelConfig(ClassPrices, kw_only=True):
    provider: str
    upstream: str | None = None
    # "chat": chat completions, responses and messages; "embedding": embeddings only.
    mode: Literal["chat", "embedding"] = "chat"
    aliases: list[str] = []  # other ids it answers to (vendor names clients send)
    fallbacks: list[FallbackConfig] = []
    price_tiers: list[PriceTier] = []
    # "catalog": prices from the genai-prices dataset under `catalog_id` ("provider/model");
    # price keys set beside it override the dataset for their class.
    prices: Literal["catalog"] | None = None
    catalog_id: str | None = None
    supports_tools: bool = False
    max_output_tokens: int = 4096
    available: bool = True

    def __post_init__(self) -> None:
        if self.max_output_tokens <= 0:
            raise ValueError("max_output_tokens must be positive")
        if (self.prices == "catalog") != (self.catalog_id is not None):
            raise ValueError('prices = "catalog" and catalog_id are set together')
        thresholds = [tier.above_input_tokens for tier in self.price_tiers]
        if thresholds != sorted(set(thresholds)):
            raise ValueError("price_tiers: above_input_tokens must increase from tier to tier")

    @property
    def priced(self) -> bool:
        """Every class it can bill has a price: input, and output unless it embeds."""
        output_priced = self.mode == "embedding" or self.output_price_per_mtok is not None
        return self.input_price_per_mtok is not None and output_priced


def _apply_catalog(name: str, model: ModelConfig) -> None:
    """Fill the model's prices from the genai-prices dataset: every class it does not set
    itself, and the tiers unless it sets its own."""
    from model_gateway.gateway.metering import price_catalog

    assert model.catalog_id is not None
    try:
        base, tiers = price_catalog.catalog_prices(model.catalog_id)
    except ValueError as exc:
        raise ValueError(f"models.{name}.{exc}") from None
    overridden = {key for key in price_catalog.CLASS_KEYS if getattr(model, key) is not None}
    for key, value in base.items():
        if key not in overridden:
            setattr(model, key, Micros(value))
    if not model.price_tiers:
        model.price_tiers = [
            PriceTier(
                above_input_tokens=threshold,
                **{key: Micros(v) for key, v in prices.items() if key not in overridden},
            )
            for threshold, prices in tiers
        ]


class ProofsConfig(_Section):
    # The transparency log's checkpoint origin (c2sp.org/tlog-checkpoint) and note key
    # name: a schema-less URL without spaces or "+". Unset: `<public_url host>/log`, or
    # gateway.local/log without public_url (gateway.proofs.checkpoint.default_origin).
    origin: Annotated[str, msgspec.Meta(pattern=r"\A[^\s+]+\Z")] | None = None
    # `gateway serve` integrates the log in a child process, on another core
    # (gateway/proofs/log_process.py). Off by default: the child's ~35 MiB would take the
    # idle footprint from 55 to 90 MiB, and it loses at one connection.
    log_process: bool = False


class SandboxNodeEntry(_Section):
    """One sandbox node the gateway sends executions to: a `[[sandbox_nodes]]` entry."""

    url: str
    secret_file: str = "data/sandbox-secret"  # noqa: S105 (a path, not a secret)
    max_concurrent: int = 4  # the node's own; the gateway never sends it more at once

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be an http(s) URL with a host, not {self.url!r}")
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")


class SandboxNodeConfig(SandboxNodeEntry):
    """`[sandbox_node]`: one node, which `gateway serve` may also run (`spawn = true`)."""

    url: str = "http://127.0.0.1:8091"
    spawn: bool = False


class SandboxPricingConfig(_Section):
    per_execution: Micros = Micros(100)
    per_second: Micros = Micros(100)


class RoutingConfig(_Section):
    # Circuit breaker per provider: open after this many consecutive failures, skipped
    # for the cool-down, then one trial request (gateway.routing.breaker).
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.breaker_failures < 1 or not self.breaker_cooldown_s > 0:
            raise ValueError("breaker_failures must be at least 1 and breaker_cooldown_s positive")


class AgentsConfig(_Section):
    # A run whose process stops renewing it for this long is failed by any live instance.
    lease_s: float = 60.0

    def __post_init__(self) -> None:
        if self.lease_s <= 0:
            raise ValueError("lease_s must be positive")


class ClusterConfig(_Section):
    # The lease of this process as an instance, and of its holds: renewed every third of
    # it; an instance that could not renew for this long serves nothing (503) and the
    # others release its holds and fail its runs.
    lease_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.lease_s > 0:
            raise ValueError("lease_s must be positive")


class Config(_Section):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    secrets: SecretsConfig = msgspec.field(default_factory=SecretsConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    ratelimit: RateLimitConfig = msgspec.field(default_factory=RateLimitConfig)
    metering: MeteringConfig = msgspec.field(default_factory=MeteringConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    purchases: PurchasesConfig | None = None
    proofs: ProofsConfig = msgspec.field(default_factory=ProofsConfig)
    providers: dict[str, ProviderConfig] = {}
    models: dict[str, ModelConfig] = {}
    sandbox_node: SandboxNodeConfig | None = None
    sandbox_nodes: list[SandboxNodeEntry] = []  # beside or instead of [sandbox_node]
    sandbox_pricing: SandboxPricingConfig = msgspec.field(default_factory=SandboxPricingConfig)
    agents: AgentsConfig = msgspec.field(default_factory=AgentsConfig)
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    routing: RoutingConfig = msgspec.field(default_factory=RoutingConfig)
    # Folder of the config file: relative paths in it resolve against this.
    base_dir: str = "."
    source: str = "config"  # the file it was read from, for messages

    def __post_init__(self) -> None:
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise ValueError(
                    f"models.{name}.provider names an unknown provider {model.provider!r}"
                )
            for i, fallback in enumerate(model.fallbacks):
                if fallback.provider not in self.providers:
                    raise ValueError(
                        f"models.{name}.fallbacks.{i}.provider names an unknown provider "
                        f"{fallback.provider!r}"
                    )
        owners: dict[str, str] = {}
        for name, model in self.models.items():
            for alias in model.aliases:
                if alias in self.models or alias in owners:
                    other = owners.get(alias, alias)
                    raise ValueError(f"models.{name}.aliases: {alias!r} is already {other!r}")
                owners[alias] = name
        for name, model in self.models.items():
            if model.prices == "catalog":
                _apply_catalog(name, model)
        for provider in self.providers.values():
            if provider.credentials_file is not None:
                provider.credentials_file = str(self.path(provider.credentials_file))
        seen: dict[str, str] = {}
        for name, node in self.sandbox_node_entries():
            url = node.url.rstrip("/")
            if url in seen:
                # Its slots would count twice: the gateway would send the node too much.
                raise ValueError(f"{name}.url repeats {seen[url]}.url ({node.url})")
            seen[url] = name
        if self.console.oidc is not None:
            _check_issuer(self.console.oidc.issuer, self.server.environment)

    def sandbox_node_entries(self) -> list[tuple[str, SandboxNodeEntry]]:
        """Every sandbox node, named by its place in the config: `sandbox_node` first,
        then `sandbox_nodes[0]`, `sandbox_nodes[1]`, ..."""
        single = [("sandbox_node", self.sandbox_node)] if self.sandbox_node is not None else []
        return single + [(f"sandbox_nodes[{i}]", n) for i, n in enumerate(self.sandbox_nodes)]

    def path(self, relative: str) -> Path:
        """A path from the config, resolved against the config file's folder."""
        return Path(self.base_dir, relative).resolve()

    @property
    def storage_url(self) -> str:
        """The storage URL with a relative SQLite path resolved like every other path."""
        url = self.storage.url
        prefix = "sqlite:///"
        if url.startswith(prefix) and not url.startswith(prefix + "/"):
            return prefix + str(self.path(url[len(prefix) :]))
        return url


def _check_issuer(issuer: str, environment: str) -> None:
    """https, or http on this machine in development (a test's or a laptop's provider)."""
    parts = urlsplit(issuer)
    local = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost")
    if parts.query or parts.fragment or not parts.hostname:
        raise ValueError("console.oidc.issuer must be a URL without query or fragment")
    if parts.scheme != "https" and not (local and environment == "development"):
        raise ValueError(
            "console.oidc.issuer must be https (http: 127.0.0.1 or localhost in development)"
        )


def _msgspec_path_to_key(message: str, base: str = "") -> str:
    # msgspec says "... - at `$.server.port`"; a TOML user thinks in `server.port`, and
    # "unknown field `prot` - at `$.server`" is the unknown key `server.prot`.
    text, _, at = message.partition(" - at `$")
    path = (base + at.rstrip("`")).lstrip(".")
    unknown = re.fullmatch(r"Object contains unknown field `([^`]+)`", text)
    if unknown:
        return f"unknown key `{path + '.' if path else ''}{unknown.group(1)}`"
    return f"{text} - at `{path}`" if path else text


def _explain(message: str, data: dict[str, Any]) -> str:
    # msgspec cannot name a table's key (`models[...]`): find the entry that fails alone.
    for section, entry_type in (("providers", ProviderConfig), ("models", ModelConfig)):
        if f"`$.{section}[...]" not in message or not isinstance(data.get(section), dict):
            continue
        for name, entry in data[section].items():
            try:
                msgspec.convert(entry, entry_type, dec_hook=_decode_hook)
            except msgspec.ValidationError as exc:
                bare = re.fullmatch(r"[A-Za-z0-9_-]+", name)
                return _msgspec_path_to_key(
                    str(exc), f"{section}.{name if bare else json.dumps(name)}"
                )
    return _msgspec_path_to_key(message)


# What serves when no config file was named and ./config.toml does not exist (the single
# binary copied alone into a folder): the built-in echo provider and its model, data in ./data.
EMBEDDED_DEFAULTS = """
[providers.local]
kind = "echo"

[models."echo-1"]
provider = "local"
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
supports_tools = true
"""


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    named = path or os.environ.get("GATEWAY_CONFIG")
    chosen = Path(named or DEFAULT_CONFIG)
    if not named and not chosen.exists():
        source = "the embedded defaults (no config.toml here)"
        return parse_config(EMBEDDED_DEFAULTS, base_dir=Path.cwd(), source=source)
    try:
        raw = chosen.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {chosen}: {exc.strerror}") from None
    return parse_config(raw, base_dir=chosen.resolve().parent, source=str(chosen))


def parse_config(
    raw: bytes | str, *, base_dir: str | os.PathLike[str] = ".", source: str = "config"
) -> Config:
    try:
        data = msgspec.toml.decode(raw)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    for injected in ("base_dir", "source"):
        if injected in data:
            raise ConfigError(f"{source}: unknown key `{injected}`")
    data["base_dir"] = str(base_dir)
    data["source"] = source
    try:
        return msgspec.convert(data, Config, dec_hook=_decode_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(str(exc), data)}") from None
