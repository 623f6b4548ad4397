"""config.toml decoded into typed structs at start-up; a typo or wrong type names its key."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Literal

import msgspec

from gateway.money import parse_amount

DEFAULT_CONFIG = "config.toml"


class ConfigError(Exception):
    pass


class _Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Micros(int):
    """An amount in micro-units, written in TOML as a decimal string ("0.50") or number."""


def _decode_hook(type_: type, value):
    if type_ is Micros:
        if isinstance(value, str | int | float):
            return Micros(parse_amount(value))  # a ValueError here names the key's path
        raise ValueError("an amount must be a decimal string or a number")
    raise NotImplementedError


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 8080
    environment: Literal["development", "production"] = "development"
    cors_origins: list[str] = []


class StorageConfig(_Section):
    url: str = "sqlite:///data/gateway.db"


class SecretsConfig(_Section):
    key_pepper_file: str = "data/key-pepper"
    signing_key_file: str = "data/signing-key"


class LimitsConfig(_Section):
    gateway_timeout_s: float = 120.0
    default_project_rpm: int = 600
    default_key_rpm: int = 600


class MeteringConfig(_Section):
    # Off only for benchmarks that measure what metering costs; never in production.
    enabled: bool = True


class ProviderConfig(_Section):
    kind: Literal["echo", "openai", "anthropic"]
    base_url: str | None = None
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        if self.kind != "echo" and not self.base_url:
            raise ValueError(f"a provider of kind {self.kind!r} needs base_url")

    def credential(self) -> str | None:
        """The upstream credential, read from the environment; None when not configured."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env) or None

    @property
    def configured(self) -> bool:
        return self.kind == "echo" or self.api_key_env is None or self.credential() is not None


class ModelConfig(_Section):
    provider: str
    upstream: str | None = None
    input_price_per_mtok: Micros | None = None  # per million tokens
    output_price_per_mtok: Micros | None = None
    supports_tools: bool = False
    max_output_tokens: int = 4096
    available: bool = True

    def __post_init__(self) -> None:
        if self.max_output_tokens <= 0:
            raise ValueError("max_output_tokens must be positive")

    @property
    def priced(self) -> bool:
        return self.input_price_per_mtok is not None and self.output_price_per_mtok is not None


class SandboxNodeConfig(_Section):
    url: str = "http://127.0.0.1:8091"
    secret_file: str = "data/sandbox-secret"  # noqa: S105 (a path, not a secret)
    max_concurrent: int = 4
    spawn: bool = False


class SandboxPricingConfig(_Section):
    per_execution: Micros = Micros(100)
    per_second: Micros = Micros(100)


class Config(_Section):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    secrets: SecretsConfig = msgspec.field(default_factory=SecretsConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    metering: MeteringConfig = msgspec.field(default_factory=MeteringConfig)
    providers: dict[str, ProviderConfig] = {}
    models: dict[str, ModelConfig] = {}
    sandbox_node: SandboxNodeConfig | None = None
    sandbox_pricing: SandboxPricingConfig = msgspec.field(default_factory=SandboxPricingConfig)
    # Folder of the config file: relative paths in it resolve against this.
    base_dir: str = "."

    def __post_init__(self) -> None:
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise ValueError(
                    f"models.{name}.provider names an unknown provider {model.provider!r}"
                )

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


def _msgspec_path_to_key(message: str, base: str = "") -> str:
    # msgspec says "... - at `$.server.port`"; a TOML user thinks in `server.port`, and
    # "unknown field `prot` - at `$.server`" is the unknown key `server.prot`.
    text, _, at = message.partition(" - at `$")
    path = (base + at.rstrip("`")).lstrip(".")
    unknown = re.fullmatch(r"Object contains unknown field `([^`]+)`", text)
    if unknown:
        return f"unknown key `{path + '.' if path else ''}{unknown.group(1)}`"
    return f"{text} - at `{path}`" if path else text


def _explain(message: str, data: dict) -> str:
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


def load_config(path: str | os.PathLike | None = None) -> Config:
    chosen = Path(path or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG)
    try:
        raw = chosen.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {chosen}: {exc.strerror}") from None
    return parse_config(raw, base_dir=chosen.resolve().parent, source=str(chosen))


def parse_config(
    raw: bytes | str, *, base_dir: str | os.PathLike = ".", source: str = "config"
) -> Config:
    try:
        data = msgspec.toml.decode(raw)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    if "base_dir" in data:
        raise ConfigError(f"{source}: unknown key `base_dir`")
    data["base_dir"] = str(base_dir)
    try:
        return msgspec.convert(data, Config, dec_hook=_decode_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(str(exc), data)}") from None
